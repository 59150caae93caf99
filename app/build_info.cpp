#include "app/build_info.h"

namespace trainer {

BuildInfo build_info() {
  BuildInfo info;
  info.version = TRAINER_VERSION;
#ifdef TRAINER_WITH_CUDA
  info.cuda = true;
#endif
#if defined(__clang__)
  info.compiler = "clang " __clang_version__;
#elif defined(__GNUC__)
  info.compiler = "gcc " __VERSION__;
#endif
  return info;
}

}  // namespace trainer
