#include "nn/caching_host_allocator.h"

#include <gtest/gtest.h>

#include <set>
#include <thread>
#include <vector>

#include "nn/tensor.h"

namespace trainer {
namespace {

// Counts what reaches the backing allocator (cudaHostAlloc in production).
class CountingAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    ++allocations;
    return cpu_allocator().allocate(nbytes);
  }
  void deallocate(void* ptr, size_t nbytes) override {
    ++deallocations;
    cpu_allocator().deallocate(ptr, nbytes);
  }
  int allocations = 0;
  int deallocations = 0;
};

TEST(CachingHostAllocator, ReusesAFreedBlockOfTheSameSizeOnly) {
  CountingAllocator backing;
  CachingHostAllocator cache(backing);
  void* a = cache.allocate(1024);
  cache.deallocate(a, 1024);
  void* b = cache.allocate(2048);  // another size: a new block
  EXPECT_NE(b, a);
  void* c = cache.allocate(1024);  // the freed one
  EXPECT_EQ(c, a);
  EXPECT_EQ(backing.allocations, 2);
  EXPECT_EQ(cache.stats().cache_hits, 1);
  EXPECT_EQ(cache.stats().backing_allocations, 2);
  cache.deallocate(b, 2048);
  cache.deallocate(c, 1024);
  EXPECT_EQ(cache.stats().cached_blocks, 2);
  EXPECT_EQ(cache.stats().cached_bytes, 3072);
  cache.empty_cache();
  EXPECT_EQ(backing.deallocations, 2);
  EXPECT_EQ(cache.stats().cached_blocks, 0);
}

// A block still owned (an upload still reading it) is never handed out twice.
TEST(CachingHostAllocator, LiveBlocksAreNeverShared) {
  CountingAllocator backing;
  CachingHostAllocator cache(backing);
  void* held = cache.allocate(64);
  void* other = cache.allocate(64);
  EXPECT_NE(held, other);
  cache.deallocate(other, 64);
  EXPECT_EQ(cache.allocate(64), other);
  cache.deallocate(other, 64);
  cache.deallocate(held, 64);
}

TEST(CachingHostAllocator, DestructorReturnsCachedBlocks) {
  CountingAllocator backing;
  {
    CachingHostAllocator cache(backing);
    cache.deallocate(cache.allocate(100), 100);
  }
  EXPECT_EQ(backing.deallocations, 1);
}

TEST(CachingHostAllocator, ThreadsGetDistinctBlocks) {
  CountingAllocator backing;
  CachingHostAllocator cache(backing);
  constexpr int kThreads = 4, kRounds = 200;
  std::vector<std::thread> threads;
  std::vector<std::set<void*>> seen(kThreads);
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        auto* p = static_cast<unsigned char*>(cache.allocate(256));
        p[0] = static_cast<unsigned char>(t);  // another owner writing here would show below
        std::this_thread::yield();
        EXPECT_EQ(p[0], static_cast<unsigned char>(t));
        cache.deallocate(p, 256);
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_LE(cache.stats().backing_allocations, kThreads);
  EXPECT_EQ(cache.stats().backing_allocations + cache.stats().cache_hits, kThreads * kRounds);
}

TEST(TensorEmptyFrom, StorageComesFromTheAllocatorAndGoesBackToIt) {
  CountingAllocator backing;
  CachingHostAllocator cache(backing);
  {
    Tensor t = Tensor::empty_from(cache, {2, 3, 4}, DType::u8);
    EXPECT_TRUE(t.device().is_cpu());
    EXPECT_TRUE(t.is_contiguous());
    EXPECT_EQ(t.nbytes(), 24u);
    t.fill_(7);
    EXPECT_EQ(t.data<uint8_t>()[23], 7);
  }
  EXPECT_EQ(cache.stats().cached_blocks, 1);
  Tensor again = Tensor::empty_from(cache, {4, 6}, DType::u8);  // same bytes: the cached block
  EXPECT_EQ(cache.stats().cache_hits, 1);
  EXPECT_EQ(backing.allocations, 1);
}

}  // namespace
}  // namespace trainer
