#include "app/common/build_info.h"

#include "source_revision.h"  // generated at build time

#ifdef TRAINER_WITH_CUDA
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <cudnn_version.h>
#include <nccl.h>
#endif

namespace trainer {

#ifdef TRAINER_WITH_CUDA
namespace {

// "13.0" from CUDA's 13000; "none" for 0 (no driver installed).
std::string cuda_version_text(int v) {
  return v == 0 ? "none" : std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

// "x.y.z" from a version code x * 10000 + y * 100 + z (cuDNN 9, NCCL >= 2.9).
std::string dotted(long long v) {
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

std::string loaded_versions() {
  int driver = 0, runtime = 0, nccl = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
  if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) runtime = 0;
  const std::string nccl_text = ncclGetVersion(&nccl) == ncclSuccess ? dotted(nccl) : "unknown";
  return "driver " + cuda_version_text(driver) + ", runtime " + cuda_version_text(runtime) + ", cuDNN " +
         dotted(static_cast<long long>(cudnnGetVersion())) + ", NCCL " + nccl_text;
}

}  // namespace
#endif

TrainerBuild trainer_build() {
  TrainerBuild info;
  info.version = TRAINER_VERSION;
  info.revision = TRAINER_SOURCE_REVISION;
#ifdef TRAINER_WITH_CUDA
  info.cuda = true;
  info.cuda_version =
      std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
  info.cudnn_version = std::to_string(CUDNN_MAJOR) + "." + std::to_string(CUDNN_MINOR) + "." +
                       std::to_string(CUDNN_PATCHLEVEL);
  info.nccl_version =
      std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." + std::to_string(NCCL_PATCH);
  info.loaded = loaded_versions();
#endif
#if defined(__clang__)
  info.compiler = "clang " __clang_version__;
#elif defined(__GNUC__)
  info.compiler = "gcc " __VERSION__;
#endif
  return info;
}

std::string TrainerBuild::str() const {
  std::string s = "trainer " + version + " (" + revision + ", " + compiler;
  s += cuda ? ", CUDA " + cuda_version + ", cuDNN " + cudnn_version : ", CPU only";
  if (!nccl_version.empty()) s += ", NCCL " + nccl_version;
  if (!loaded.empty()) s += "; loaded: " + loaded;
  return s + ")";
}

}  // namespace trainer
