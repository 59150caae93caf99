#pragma once
// Storage for tensors comes through this interface so that the CUDA backend can plug in its caching
// allocator (cudaMalloc in large blocks, reuse by size class) without touching the tensor code.
#include <cstddef>
#include <cstdint>

#include "nn/device.h"

namespace trainer {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
};

// 64-byte aligned host memory.
Allocator& cpu_allocator();

// Bytes the CPU allocator has handed out (rounded to its 64-byte granule) and not yet taken back, and
// the most at any moment since the start or the last reset: what `trainer plan` measures a dry-run
// step with, like cuda_memory_stats() on a GPU. Counted with relaxed atomics (loader threads allocate too).
struct CpuMemoryStats {
  int64_t allocated_bytes = 0;
  int64_t peak_allocated_bytes = 0;
};
CpuMemoryStats cpu_memory_stats();
// Sets the peak to what is allocated now.
void cpu_reset_peak_memory_stats();

// The allocator for a device; a backend registers its own for DeviceKind::cuda.
Allocator& allocator_for(Device device);
void register_allocator(DeviceKind kind, Allocator* allocator);

}  // namespace trainer
