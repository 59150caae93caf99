#include "app/build_info.h"

#ifdef TRAINER_WITH_CUDA
#include <cuda_runtime_api.h>
#include <cudnn_version.h>
#include <nccl.h>
#endif

namespace trainer {

TrainerBuild trainer_build() {
  TrainerBuild info;
  info.version = TRAINER_VERSION;
#ifdef TRAINER_WITH_CUDA
  info.cuda = true;
  info.cuda_version =
      std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
  info.cudnn_version = std::to_string(CUDNN_MAJOR) + "." + std::to_string(CUDNN_MINOR) + "." +
                       std::to_string(CUDNN_PATCHLEVEL);
  info.nccl_version =
      std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." + std::to_string(NCCL_PATCH);
#endif
#if defined(__clang__)
  info.compiler = "clang " __clang_version__;
#elif defined(__GNUC__)
  info.compiler = "gcc " __VERSION__;
#endif
  return info;
}

std::string TrainerBuild::str() const {
  std::string s = "trainer " + version + " (" + compiler;
  s += cuda ? ", CUDA " + cuda_version + ", cuDNN " + cudnn_version : ", CPU only";
  if (!nccl_version.empty()) s += ", NCCL " + nccl_version;
  return s + ")";
}

}  // namespace trainer
