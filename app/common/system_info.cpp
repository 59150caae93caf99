#include "app/common/system_info.h"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "dist/process_env.h"
#ifdef TRAINER_WITH_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "nn/cuda/cuda_backend.h"
#endif

namespace trainer {
#ifdef TRAINER_WITH_CUDA
namespace {

std::string version_string(int v) {  // CUDA encodes 13.0 as 13000
  return v > 0 ? std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10) : "";
}

}  // namespace
#endif

SystemInfo system_info() {
  SystemInfo s;
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) == 0) s.hostname = host;
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      s.cpu_model = line.substr(line.find(':') + 2);
      break;
    }
  }
  s.cpu_cores = std::max(1u, std::thread::hardware_concurrency());
  s.avx512 = __builtin_cpu_supports("avx512f");
  s.avx2 = __builtin_cpu_supports("avx2");
  s.blas_core = openblas_get_corename();
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  s.cuda_visible_devices = visible ? visible : "(unset)";
#ifdef TRAINER_WITH_CUDA
  s.cuda_build = true;
  int v = 0;
  if (cudaDriverGetVersion(&v) == cudaSuccess) s.cuda_driver_version = version_string(v);
  if (cudaRuntimeGetVersion(&v) == cudaSuccess) s.cuda_runtime_version = version_string(v);
  if (ncclGetVersion(&v) == ncclSuccess)  // NCCL >= 2.9 encodes 2.28.9 as 22809
    s.nccl_runtime_version =
        std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
  const int n = cuda_device_count();
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    s.gpus.push_back({i, p.name, static_cast<int64_t>(p.totalGlobalMem), p.major, p.minor});
  }
#endif
  for (const auto& [k, val] : current_environment())
    if (k.rfind("NCCL_", 0) == 0) s.nccl_env.emplace_back(k, val);
  return s;
}

}  // namespace trainer
