#include "dist/collective_smoke.h"

#include "nn/runtime.h"

namespace trainer {

CollectiveSmoke local_all_reduce_smoke(int visible_gpus, std::chrono::milliseconds timeout) {
  // The largest size is the one a gradient all-reduce resembles (tens to hundreds of MiB of buckets).
  if (runtime::cuda_built() && visible_gpus >= 2)
    return nccl_all_reduce_smoke({1u << 20, 32u << 20, 256u << 20}, 20, timeout);
  return cpu_all_reduce_smoke(2, {64u << 10, 1u << 20, 16u << 20}, 5, timeout);
}

}  // namespace trainer
