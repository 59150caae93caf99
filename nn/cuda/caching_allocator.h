#pragma once
// The device memory allocator: cudaMalloc in large segments, carved into blocks that are cached and
// reused instead of being returned to the driver (cudaMalloc and cudaFree are slow and cudaFree
// synchronises the device). Never managed memory.
//
// Block sizes are multiples of 512 bytes (so the peak counts what tensors use, as PyTorch's does).
// Requests up to 1 MiB are carved out of 2 MiB segments, up to 10 MiB out of shared 20 MiB segments;
// larger ones get a segment rounded to 2 MiB unless a cached block fits (PyTorch's policy). A block
// is split when it is larger than the request (a large one only when at least 1 MiB is left), and
// merged with free neighbours of its segment when freed.
//
// Frees are stream-ordered: every kernel runs on the one compute stream, so a block handed back when
// its tensor dies may be reused at once by work queued later on that stream, which runs after the
// work that used it. Code that uses a device tensor on ANOTHER stream (e.g. NCCL on a communication
// stream) must keep the tensor alive until that stream has passed an event recorded after the use
// (cudaEventRecord on the other stream + cudaStreamWaitEvent on the compute stream), or the block
// could be reused while the other stream still reads it.
#include <cstddef>
#include <cstdint>

#include "nn/allocator.h"

namespace trainer {

struct CudaMemoryStats {
  int64_t allocated_bytes = 0;       // in blocks handed out (rounded sizes)
  int64_t requested_bytes = 0;       // as asked for
  int64_t reserved_bytes = 0;        // in segments obtained from cudaMalloc
  int64_t peak_allocated_bytes = 0;  // since start or the last reset_peak
  int64_t peak_reserved_bytes = 0;
  int64_t segments = 0;        // live cudaMalloc segments
  int64_t device_mallocs = 0;  // cudaMalloc calls so far
  int64_t device_frees = 0;    // cudaFree calls so far
  int64_t cache_hits = 0;      // allocations served from cached blocks
};

CudaMemoryStats cuda_memory_stats();
void cuda_reset_peak_memory_stats();
// Returns every fully free segment to the driver (waits for the compute stream first).
void cuda_empty_cache();

namespace cuda {
Allocator& caching_allocator();

// Private pools, for CUDA graphs: a captured graph replays its kernels on the addresses it was
// captured with, so the memory its step allocated must not be handed to anyone else afterwards.
// While a PrivatePoolScope is alive, this thread's device allocations come from (and its frees of
// those blocks return to) the pool; blocks freed during the capture are reused within it, which is
// safe because replays run the captured work in the same order on the one compute stream.
int create_private_pool();
// The pool's memory goes back to the shared pool (after the graph that used it is destroyed).
void release_private_pool(int id);
class PrivatePoolScope {
 public:
  explicit PrivatePoolScope(int pool);
  ~PrivatePoolScope();
  PrivatePoolScope(const PrivatePoolScope&) = delete;
  PrivatePoolScope& operator=(const PrivatePoolScope&) = delete;

 private:
  int previous_;
};
}  // namespace cuda

}  // namespace trainer
