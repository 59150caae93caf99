#include "nn/caching_host_allocator.h"

namespace trainer {

CachingHostAllocator::~CachingHostAllocator() { empty_cache(); }

void* CachingHostAllocator::allocate(size_t nbytes) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.find(nbytes);
    if (it != free_.end()) {
      void* ptr = it->second;
      free_.erase(it);
      ++stats_.cache_hits;
      --stats_.cached_blocks;
      stats_.cached_bytes -= static_cast<int64_t>(nbytes);
      return ptr;
    }
  }
  // Outside the lock: pinning can take milliseconds and other workers may hit the cache meanwhile.
  void* ptr = backing_.allocate(nbytes);
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.backing_allocations;
  return ptr;
}

void CachingHostAllocator::deallocate(void* ptr, size_t nbytes) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  free_.emplace(nbytes, ptr);
  ++stats_.cached_blocks;
  stats_.cached_bytes += static_cast<int64_t>(nbytes);
}

CachingHostAllocatorStats CachingHostAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingHostAllocator::empty_cache() {
  std::multimap<size_t, void*> blocks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    blocks.swap(free_);
    stats_.cached_blocks = 0;
    stats_.cached_bytes = 0;
  }
  for (const auto& [nbytes, ptr] : blocks) backing_.deallocate(ptr, nbytes);
}

}  // namespace trainer
