#pragma once
// Debian's OpenBLAS 0.3.21 does not recognise recent Xeons and falls back to its generic "Prescott"
// kernels, several times slower than its AVX-512 ones on the same CPU (figures: bench/PERF_NOTES.md,
// "Figures moved out of headers"). OpenBLAS reads OPENBLAS_CORETYPE only when it is loaded, so
// the fix is to re-execute the binary with the variable set. A user's own OPENBLAS_CORETYPE always wins.

namespace trainer {

// Re-executes the current process with OPENBLAS_CORETYPE set when OpenBLAS chose its generic kernels
// on a CPU with AVX-512 (SkylakeX kernels) or AVX2 (Haswell kernels). Returns when nothing is to be
// done or the re-exec failed.
void select_fast_blas_kernels(char** argv);

}  // namespace trainer
