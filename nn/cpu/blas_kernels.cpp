#include "nn/cpu/blas_kernels.h"

#include <cblas.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace trainer {

void select_fast_blas_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") || std::getenv("TRAINER_BLAS_REEXEC")) return;
  const std::string core = openblas_get_corename();
  if (core != "Prescott" && core != "prescott") return;
  const char* better = __builtin_cpu_supports("avx512f") ? "SkylakeX"
                       : __builtin_cpu_supports("avx2")  ? "Haswell"
                                                         : nullptr;
  if (!better) return;
  ::setenv("OPENBLAS_CORETYPE", better, 1);
  ::setenv("TRAINER_BLAS_REEXEC", "1", 1);  // never loop, whatever the library does with the variable
  ::execv("/proc/self/exe", argv);
  // execv failed: carry on with the slow kernels rather than not at all.
}

}  // namespace trainer
