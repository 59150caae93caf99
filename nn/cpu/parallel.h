#pragma once
// Splitting the CPU backend's elementwise and per-channel loops over the OpenMP threads that oneDNN's
// convolutions use (GNU OpenMP): between two convolutions those threads would otherwise spin idle
// while one core runs BatchNorm, ReLU, the residual adds and SGD.
//
// Results never depend on the thread count: a range of independent elements or of whole channels goes
// to one thread, and no single sum is ever split.
#include <cstdint>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace trainer::cpu {

// Below this many elements of work a loop stays on the calling thread: waking the team costs a few
// microseconds, more than a 32K-element pass takes on one core.
inline constexpr int64_t kParallelMinElements = 32768;

// Calls fn(begin, end) on disjoint ranges covering [0, n), one per thread, when `work` (elements
// touched) reaches kParallelMinElements; otherwise fn(0, n) here. Range ends are multiples of `align`
// (but the last) so vectorised loops keep whole vectors and threads do not share cache lines.
template <class Fn>
void parallel_ranges(int64_t n, int64_t work, Fn&& fn, int64_t align = 16) {
#ifdef _OPENMP
  if (work >= kParallelMinElements && n > 1 && !omp_in_parallel() && omp_get_max_threads() > 1) {
#pragma omp parallel
    {
      const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      const int64_t chunks = (n + align - 1) / align;
      const int64_t b = chunks * t / nt * align, e = t + 1 == nt ? n : chunks * (t + 1) / nt * align;
      if (b < e) fn(b, e < n ? e : n);
    }
    return;
  }
#endif
  fn(int64_t{0}, n);
}

}  // namespace trainer::cpu
