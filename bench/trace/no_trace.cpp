// nn_bench --trace in a build without the CUDA backend: there is no GPU work to trace.
#include <cstdio>

#include "bench/trace/kernel_trace.h"

namespace trainer::trace {

bool start() {
  std::fprintf(stderr, "nn_bench: --trace needs a CUDA build (CUPTI)\n");
  return false;
}

void report(int, double) {}

}  // namespace trainer::trace
