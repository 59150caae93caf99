#include "app/common/build_info.h"

#include "dist/nccl_backend.h"
#include "nn/runtime.h"
#include "source_revision.h"  // generated at build time

namespace trainer {
namespace {

// "13.0" from CUDA's 13000; "none" for 0 (no driver installed).
std::string cuda_version_text(int v) {
  return v == 0 ? "none" : std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

// "x.y.z" from a version code x * 10000 + y * 100 + z (cuDNN 9).
std::string dotted(int64_t v) {
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

std::string loaded_versions(const runtime::BackendVersions& v) {
  const std::string nccl = nccl_loaded_version();
  return "driver " + cuda_version_text(v.cuda_driver) + ", runtime " + cuda_version_text(v.cuda_runtime) +
         ", cuDNN " + dotted(v.cudnn_loaded) + ", NCCL " + (nccl.empty() ? "unknown" : nccl);
}

}  // namespace

TrainerBuild trainer_build() {
  TrainerBuild info;
  info.version = TRAINER_VERSION;
  info.revision = TRAINER_SOURCE_REVISION;
  if (runtime::cuda_built()) {
    const runtime::BackendVersions v = runtime::backend_versions();
    info.cuda = true;
    info.cuda_version =
        std::to_string(v.cuda_compiled / 1000) + "." + std::to_string(v.cuda_compiled % 1000 / 10);
    info.cudnn_version = dotted(v.cudnn_compiled);
    info.nccl_version = nccl_compiled_version();
    info.loaded = loaded_versions(v);
  }
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
