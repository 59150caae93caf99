#include "nn/cuda/pinned_allocator.h"

#include "nn/cuda/cuda_backend.h"

namespace trainer::cuda {
namespace {

class CudaHostAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    // Loader workers call this, and a thread starts on device 0: without selecting ours, every rank
    // would create a context (hundreds of MiB) on GPU 0.
    CUDA_CHECK(cudaSetDevice(cuda_context().device));
    void* ptr = nullptr;
    CUDA_CHECK(cudaHostAlloc(&ptr, nbytes, cudaHostAllocPortable));
    return ptr;
  }
  void deallocate(void* ptr, size_t) override {
    // No throwing from a destructor path: a failure here means the context is already gone at exit.
    if (ptr != nullptr) (void)cudaFreeHost(ptr);
  }
};

}  // namespace

CachingHostAllocator& pinned_host_allocator() {
  static CudaHostAllocator* backing = new CudaHostAllocator();
  static CachingHostAllocator* cache = new CachingHostAllocator(*backing);
  return *cache;
}

}  // namespace trainer::cuda
