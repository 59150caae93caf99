#pragma once
// Keeps freed host blocks for reuse instead of handing them back to a slow backing allocator: pinning
// memory (cudaHostAlloc) costs far more than a batch takes to load, and the loader asks for the same
// few batch sizes over and over. A block is reused only for a request of exactly its size (batches
// have two or three sizes: full, the last partial one, the labels), so nothing is split or merged.
//
// A block is reused as soon as its owner frees it. Whoever copies from it asynchronously (the copy
// stream of data/device_prefetcher.cpp) must keep the tensor alive until the copy has completed.
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "nn/allocator.h"

namespace trainer {

struct CachingHostAllocatorStats {
  int64_t backing_allocations = 0;  // blocks obtained from the backing allocator
  int64_t cache_hits = 0;           // requests served from a freed block
  int64_t cached_blocks = 0;        // free blocks held now
  int64_t cached_bytes = 0;
};

class CachingHostAllocator final : public Allocator {
 public:
  // backing must outlive this allocator; it receives every cached block back in the destructor.
  explicit CachingHostAllocator(Allocator& backing) : backing_(backing) {}
  ~CachingHostAllocator() override;
  CachingHostAllocator(const CachingHostAllocator&) = delete;
  CachingHostAllocator& operator=(const CachingHostAllocator&) = delete;

  void* allocate(size_t nbytes) override;  // thread-safe: loader workers allocate concurrently
  void deallocate(void* ptr, size_t nbytes) override;

  CachingHostAllocatorStats stats() const;
  // Returns every cached block to the backing allocator.
  void empty_cache();

 private:
  Allocator& backing_;
  mutable std::mutex mutex_;
  std::multimap<size_t, void*> free_;  // size -> free block
  CachingHostAllocatorStats stats_;
};

}  // namespace trainer
