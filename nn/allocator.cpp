#include "nn/allocator.h"

#include <malloc.h>

#include <cstdlib>
#include <new>
#include <stdexcept>

namespace trainer {
namespace {

class CpuAllocator final : public Allocator {
 public:
  CpuAllocator() {
    // Training allocates and frees the same large activation buffers every step. glibc would serve
    // each from a fresh mmap and unmap it on free, so every step paid page faults for all of them
    // (measured: more system than user time). Keep freed memory in the heap for reuse instead.
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const size_t rounded = (nbytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (!p) throw std::bad_alloc();
    return p;
  }
  void deallocate(void* ptr, size_t) override { std::free(ptr); }
};

Allocator* g_cuda_allocator = nullptr;

}  // namespace

Allocator& cpu_allocator() {
  static CpuAllocator allocator;
  return allocator;
}

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) return cpu_allocator();
  if (!g_cuda_allocator)
    throw std::runtime_error("no CUDA allocator: this build has no CUDA backend or it is not initialised");
  return *g_cuda_allocator;
}

void register_allocator(DeviceKind kind, Allocator* allocator) {
  if (kind == DeviceKind::cuda) g_cuda_allocator = allocator;
}

}  // namespace trainer
