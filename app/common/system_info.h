#pragma once
// What machine a result came from, for `trainer bench` records and `trainer doctor`: host, CPU, GPUs
// (when built with CUDA), the BLAS kernels in use and every NCCL_* variable in effect.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace trainer {

struct GpuInfo {
  int index = 0;
  std::string name;
  int64_t total_memory_bytes = 0;
  int compute_major = 0, compute_minor = 0;
};

struct SystemInfo {
  std::string hostname;
  std::string cpu_model;   // /proc/cpuinfo "model name", or "" when unknown
  unsigned cpu_cores = 0;  // std::thread::hardware_concurrency
  bool avx512 = false, avx2 = false;
  std::string blas_core;             // openblas_get_corename()
  std::string cuda_visible_devices;  // "(unset)" when not set
  bool cuda_build = false;
  std::string cuda_driver_version;  // "13.0", or "" without CUDA / driver
  std::string cuda_runtime_version;
  // The NCCL library loaded at run time (a GPU host's wheel may differ from the headers built against).
  std::string nccl_runtime_version;
  std::vector<GpuInfo> gpus;  // empty without CUDA or without a visible device
  std::vector<std::pair<std::string, std::string>> nccl_env;  // every NCCL_* variable, sorted
};

SystemInfo system_info();

}  // namespace trainer
