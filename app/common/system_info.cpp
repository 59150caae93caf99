#include "app/common/system_info.h"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <thread>

#include "dist/nccl_backend.h"
#include "dist/process_env.h"
#include "nn/runtime.h"

namespace trainer {
namespace {

std::string version_string(int v) {  // CUDA encodes 13.0 as 13000
  return v > 0 ? std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10) : "";
}

}  // namespace

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
  s.cuda_build = runtime::cuda_built();
  const runtime::BackendVersions v = runtime::backend_versions();
  s.cuda_driver_version = version_string(v.cuda_driver);
  s.cuda_runtime_version = version_string(v.cuda_runtime);
  s.nccl_runtime_version = nccl_loaded_version();
  const int n = runtime::device_count();
  for (int i = 0; i < n; ++i)
    if (const std::optional<runtime::GpuProperties> p = runtime::gpu_properties(i))
      s.gpus.push_back({i, p->name, p->total_memory_bytes, p->major, p->minor});
  for (const auto& [k, val] : current_environment())
    if (k.rfind("NCCL_", 0) == 0) s.nccl_env.emplace_back(k, val);
  return s;
}

}  // namespace trainer
