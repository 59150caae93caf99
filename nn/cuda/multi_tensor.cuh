#pragma once
// Multi-tensor launches (the optimizers' *_step_many, gradient-norm clipping): up to a fixed number of
// tensors per launch, passed by value in the kernel's arguments (no device table to fill: in a CUDA graph
// the arguments are the captured addresses, which replays keep), each block taking one chunk of one
// tensor. A launch struct has `tensors`, `numel[]` and `chunk_start[]` (tensor t's first block; the
// entry after the last tensor is the grid size).
#include <cstdint>

namespace trainer::cuda {

// The elements [begin, end) of tensor `tensor` that this block of a multi-tensor launch updates: block
// b is chunk b - chunk_start[t] of the tensor t whose chunks hold it.
struct BlockChunk {
  int tensor;
  int64_t begin, end;
};
template <class Launch>
__device__ __forceinline__ BlockChunk block_chunk(const Launch& l, int64_t chunk_size) {
  int t = 0;
  while (t + 1 < l.tensors && l.chunk_start[t + 1] <= static_cast<int>(blockIdx.x)) ++t;
  const int64_t begin = (blockIdx.x - l.chunk_start[t]) * chunk_size;
  return {t, begin, begin + chunk_size < l.numel[t] ? begin + chunk_size : l.numel[t]};
}

}  // namespace trainer::cuda
