#include "nn/cuda/caching_allocator.h"

#include <algorithm>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "nn/cuda/cuda_backend.h"

namespace trainer {
namespace {

constexpr size_t kRound = 512;                      // every block size is a multiple of this
constexpr size_t kSmallLimit = size_t{1} << 20;     // requests up to this come from small segments
constexpr size_t kSmallSegment = size_t{2} << 20;   // size of a small segment
constexpr size_t kMidLimit = size_t{10} << 20;      // larger requests up to this share ...
constexpr size_t kMidSegment = size_t{20} << 20;    // ... segments of this size
constexpr size_t kLargeRound = size_t{2} << 20;     // larger ones get segments rounded to this
constexpr size_t kMinLargeRemainder = kSmallLimit;  // a large block is split only if more is left

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

std::string mib(int64_t bytes) { return std::to_string(bytes / (1 << 20)) + " MiB"; }

struct Block {
  char* ptr;
  size_t size;
  size_t requested = 0;
  bool small;
  bool free = true;
  int pool = 0;           // 0: the shared pool; otherwise a private pool (all blocks of a segment alike)
  Block* prev = nullptr;  // neighbours in the same segment
  Block* next = nullptr;
};

struct BySize {
  bool operator()(const Block* a, const Block* b) const {
    return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
  }
};

// The private pool this thread allocates from (0: the shared one); see cuda::PrivatePoolScope.
thread_local int t_active_pool = 0;

class CachingAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    std::lock_guard<std::mutex> lock(mutex_);
    const bool small = nbytes <= kSmallLimit;
    const size_t size = round_up(nbytes, kRound);
    const int pool_id = t_active_pool;
    auto& pool = free_lists(pool_id, small);
    Block key{nullptr, size, 0, small};
    Block* block = nullptr;
    auto it = pool.lower_bound(&key);
    if (it != pool.end()) {
      block = *it;
      pool.erase(it);
      ++stats_.cache_hits;
    } else {
      const size_t segment = small               ? kSmallSegment
                             : size <= kMidLimit ? kMidSegment
                                                 : round_up(size, kLargeRound);
      block = new_segment(segment, small, nbytes);
      block->pool = pool_id;
    }
    // Split off the rest, which stays cached; a large block keeps a small remainder (too small to
    // serve a large request, it would only fragment the segment).
    if (block->size > size && (small || block->size - size >= kMinLargeRemainder)) {
      Block* rest = new Block{block->ptr + size, block->size - size, 0, small};
      rest->pool = block->pool;
      rest->prev = block;
      rest->next = block->next;
      if (block->next) block->next->prev = rest;
      block->next = rest;
      block->size = size;
      pool.insert(rest);
    }
    block->free = false;
    block->requested = nbytes;
    live_.emplace(block->ptr, block);
    stats_.allocated_bytes += static_cast<int64_t>(block->size);
    stats_.requested_bytes += static_cast<int64_t>(nbytes);
    stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
    return block->ptr;
  }

  void deallocate(void* ptr, size_t) override {
    if (!ptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(ptr);
    if (it == live_.end()) return;  // not ours; never happens with Storage
    Block* block = it->second;
    live_.erase(it);
    stats_.allocated_bytes -= static_cast<int64_t>(block->size);
    stats_.requested_bytes -= static_cast<int64_t>(block->requested);
    auto& pool = free_lists(block->pool, block->small);
    block->free = true;
    if (block->next && block->next->free) merge(block, block->next, pool);
    if (block->prev && block->prev->free) {
      Block* prev = block->prev;
      pool.erase(prev);
      merge(prev, block, pool);
      block = prev;
    }
    pool.insert(block);
  }

  int create_pool() {
    std::lock_guard<std::mutex> lock(mutex_);
    const int id = next_pool_++;
    private_pools_[id];
    return id;
  }

  // Hands a private pool's segments to the shared pool: its free blocks join the shared free lists
  // and blocks still in use return there when freed.
  void release_pool(int id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = private_pools_.find(id);
    if (it == private_pools_.end()) return;
    for (auto& [ptr, block] : live_)
      if (block->pool == id) block->pool = 0;
    for (auto* from : {&it->second.small, &it->second.large})
      for (Block* b : *from) {
        b->pool = 0;
        (b->small ? free_small_ : free_large_).insert(b);
      }
    private_pools_.erase(it);
  }

  void empty_cache() {
    cuda_synchronize();  // cached blocks may still be used by queued kernels
    std::lock_guard<std::mutex> lock(mutex_);
    release_free_segments();
  }

  CudaMemoryStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak_allocated_bytes = stats_.allocated_bytes;
    stats_.peak_reserved_bytes = stats_.reserved_bytes;
  }

 private:
  // Merges b (free, already out of the pool) into a, its left neighbour.
  void merge(Block* a, Block* b, std::set<Block*, BySize>& pool) {
    pool.erase(b);
    a->size += b->size;
    a->next = b->next;
    if (b->next) b->next->prev = a;
    delete b;
  }

  Block* new_segment(size_t size, bool small, size_t requested) {
    cuda_stream();  // makes our device current on this thread
    void* ptr = nullptr;
    cudaError_t status = cudaMalloc(&ptr, size);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      CUDA_CHECK(cudaStreamSynchronize(cuda_context().stream));
      release_free_segments();
      status = cudaMalloc(&ptr, size);
    }
    if (status != cudaSuccess) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      throw std::runtime_error(
          "CUDA out of memory: tried to allocate " + mib(static_cast<int64_t>(requested)) + " (" +
          cudaGetErrorString(status) + "); this process holds " + mib(stats_.allocated_bytes) +
          " in tensors, " + mib(stats_.reserved_bytes) + " reserved; the GPU has " +
          mib(static_cast<int64_t>(free_b)) + " free of " + mib(static_cast<int64_t>(total_b)) +
          ". HINT: lower data.batch_size, use precision = \"bf16\", or check nvidia-smi for other processes");
    }
    ++stats_.device_mallocs;
    ++stats_.segments;
    stats_.reserved_bytes += static_cast<int64_t>(size);
    stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
    return new Block{static_cast<char*>(ptr), size, 0, small};
  }

  void release_free_segments() {
    for (auto* pool : {&free_small_, &free_large_}) {
      for (auto it = pool->begin(); it != pool->end();) {
        Block* b = *it;
        if (b->prev || b->next) {  // part of a segment still in use
          ++it;
          continue;
        }
        cudaFree(b->ptr);
        ++stats_.device_frees;
        --stats_.segments;
        stats_.reserved_bytes -= static_cast<int64_t>(b->size);
        it = pool->erase(it);
        delete b;
      }
    }
  }

  struct FreeLists {
    std::set<Block*, BySize> small, large;
  };
  std::set<Block*, BySize>& free_lists(int pool, bool small) {
    if (pool == 0) return small ? free_small_ : free_large_;
    FreeLists& p = private_pools_.at(pool);
    return small ? p.small : p.large;
  }

  std::mutex mutex_;
  std::set<Block*, BySize> free_small_, free_large_;
  std::unordered_map<int, FreeLists> private_pools_;
  int next_pool_ = 1;
  std::unordered_map<void*, Block*> live_;
  CudaMemoryStats stats_;
};

CachingAllocator& instance() {
  static CachingAllocator* allocator = new CachingAllocator();  // leaked: outlives static tensors
  return *allocator;
}

}  // namespace

CudaMemoryStats cuda_memory_stats() { return instance().stats(); }
void cuda_reset_peak_memory_stats() { instance().reset_peak(); }
void cuda_empty_cache() { instance().empty_cache(); }

namespace cuda {
Allocator& caching_allocator() { return instance(); }

int create_private_pool() { return instance().create_pool(); }
void release_private_pool(int id) { instance().release_pool(id); }
PrivatePoolScope::PrivatePoolScope(int id) : previous_(t_active_pool) { t_active_pool = id; }
PrivatePoolScope::~PrivatePoolScope() { t_active_pool = previous_; }
}  // namespace cuda

}  // namespace trainer
