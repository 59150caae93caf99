#include "nn/allocator.h"

#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <stdexcept>

namespace trainer {
namespace {

std::atomic<int64_t> g_cpu_allocated{0};
std::atomic<int64_t> g_cpu_peak{0};

size_t granule_rounded(size_t nbytes) { return (nbytes + 63) / 64 * 64; }

void note_cpu_allocation(int64_t nbytes) {
  const int64_t now = g_cpu_allocated.fetch_add(nbytes, std::memory_order_relaxed) + nbytes;
  int64_t peak = g_cpu_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_cpu_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

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
    const size_t rounded = granule_rounded(nbytes);
    void* p = std::aligned_alloc(64, rounded);
    if (!p) throw std::bad_alloc();
    note_cpu_allocation(static_cast<int64_t>(rounded));
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    if (!ptr) return;
    std::free(ptr);
    g_cpu_allocated.fetch_sub(static_cast<int64_t>(granule_rounded(nbytes)), std::memory_order_relaxed);
  }
};

Allocator* g_cuda_allocator = nullptr;

}  // namespace

Allocator& cpu_allocator() {
  static CpuAllocator allocator;
  return allocator;
}

CpuMemoryStats cpu_memory_stats() {
  return {g_cpu_allocated.load(std::memory_order_relaxed), g_cpu_peak.load(std::memory_order_relaxed)};
}

void cpu_reset_peak_memory_stats() { g_cpu_peak.store(g_cpu_allocated.load(std::memory_order_relaxed)); }

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
