#pragma once
// Storage for tensors comes through this interface so that the CUDA backend can plug in its caching
// allocator (cudaMalloc in large blocks, reuse by size class) without touching the tensor code.
#include <cstddef>

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

// The allocator for a device; a backend registers its own for DeviceKind::cuda.
Allocator& allocator_for(Device device);
void register_allocator(DeviceKind kind, Allocator* allocator);

}  // namespace trainer
