#pragma once
// Page-locked (pinned) host memory for batches bound for the GPU: cudaMemcpyAsync from pinned memory
// is a DMA transfer that overlaps with kernels, while from pageable memory the driver first stages it
// through a bounce buffer on the calling thread. Blocks are cached (nn/caching_host_allocator.h)
// because cudaHostAlloc and cudaFreeHost are slow and cudaFreeHost synchronises the device.
//
// Plain C++ (no CUDA headers), so that data/ can include it in CUDA builds.
#include "nn/caching_host_allocator.h"

namespace trainer::cuda {

// The process-wide pinned allocator (portable: usable from any device's streams). Never destroyed, so
// that pinned tensors still alive at exit stay valid.
CachingHostAllocator& pinned_host_allocator();

}  // namespace trainer::cuda
