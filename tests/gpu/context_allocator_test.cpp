// The CUDA context (device selection errors, check macros) and the caching allocator.
#include <string>

#include "nn/allocator.h"
#include "nn/cuda/caching_allocator.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainer {
namespace {

using namespace gpu_test;

// Runs with or without a GPU: asking for a device past the visible ones is an error with a hint.
TEST(CudaContext, MissingDeviceNamesTheCountAndAHint) {
  const int count = cuda_device_count();
  const int index = count + 3;
  try {
    init_cuda_backend(index);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("LOCAL_RANK " + std::to_string(index) + " asks for GPU " + std::to_string(index) +
                       " but only " + std::to_string(count) + " are visible. HINT: "),
              std::string::npos)
        << msg;
  }
}

TEST(CudaContext, CheckMacrosNameFileLineAndHint) {
  try {
    CUDA_CHECK(cudaErrorMemoryAllocation);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cudaErrorMemoryAllocation"), std::string::npos) << msg;
    EXPECT_NE(msg.find("context_allocator_test.cpp:"), std::string::npos) << msg;
    EXPECT_NE(msg.find("HINT:"), std::string::npos) << msg;
  }
  EXPECT_THROW(CUDNN_CHECK(CUDNN_STATUS_NOT_SUPPORTED), std::runtime_error);
  EXPECT_THROW(CUBLAS_CHECK(CUBLAS_STATUS_NOT_SUPPORTED), std::runtime_error);
}

// The seed guides' "CUDA driver version is insufficient": a node whose driver is older than the
// build's CUDA runtime is told to update the driver (the case itself needs such a node).
TEST(CudaContext, AnOldDriverIsToldToUpdate) {
  try {
    CUDA_CHECK(cudaErrorInsufficientDriver);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cudaErrorInsufficientDriver"), std::string::npos) << msg;
    EXPECT_NE(msg.find("HINT: the NVIDIA driver is older than this build's CUDA runtime: update the driver"),
              std::string::npos)
        << msg;
  }
}

TEST(CudaContext, InitIsIdempotentAndRegistersTheBackend) {
  REQUIRE_GPU();
  init_cuda_backend(0);
  EXPECT_EQ(cuda_context().device, 0);
  EXPECT_GT(cuda_context().sm_count, 0);
  EXPECT_EQ(&backend_for(gpu()), &dev());
  EXPECT_NE(&backend_for(gpu()), &cpu());
}

TEST(CudaAllocator, ZeroBytesIsNull) {
  REQUIRE_GPU();
  EXPECT_EQ(allocator_for(gpu()).allocate(0), nullptr);
  allocator_for(gpu()).deallocate(nullptr, 0);
  Tensor empty = Tensor::empty({0, 3}, DType::f32, gpu());
  EXPECT_EQ(empty.numel(), 0);
}

TEST(CudaAllocator, FreedBlockIsReusedWithoutCudaMalloc) {
  REQUIRE_GPU();
  Allocator& a = allocator_for(gpu());
  void* p = a.allocate(3 << 20);
  a.deallocate(p, 3 << 20);
  const CudaMemoryStats before = cuda_memory_stats();
  void* q = a.allocate(3 << 20);
  const CudaMemoryStats after = cuda_memory_stats();
  EXPECT_EQ(p, q);
  EXPECT_EQ(after.device_mallocs, before.device_mallocs);
  EXPECT_EQ(after.cache_hits, before.cache_hits + 1);
  a.deallocate(q, 3 << 20);

  void* s = a.allocate(1000);  // small blocks are carved from shared segments and reused too
  a.deallocate(s, 1000);
  void* t = a.allocate(900);
  EXPECT_EQ(s, t);
  a.deallocate(t, 900);
}

TEST(CudaAllocator, StatsRoundAndTrackPeak) {
  REQUIRE_GPU();
  Allocator& a = allocator_for(gpu());
  cuda_reset_peak_memory_stats();
  const CudaMemoryStats s0 = cuda_memory_stats();
  void* small = a.allocate(1);  // rounded to 512 bytes
  const CudaMemoryStats s1 = cuda_memory_stats();
  EXPECT_EQ(s1.allocated_bytes - s0.allocated_bytes, 512);
  EXPECT_EQ(s1.requested_bytes - s0.requested_bytes, 1);
  // Large requests are rounded to 512 bytes too; a cached block is split unless less than 1 MiB
  // would be left, so the block is at most 1 MiB larger than that.
  void* large = a.allocate((3 << 20) + 1);
  const CudaMemoryStats s2 = cuda_memory_stats();
  EXPECT_GE(s2.allocated_bytes - s1.allocated_bytes, (3 << 20) + 512);
  EXPECT_LT(s2.allocated_bytes - s1.allocated_bytes, (4 << 20) + 512);
  EXPECT_GE(s2.reserved_bytes, s2.allocated_bytes);
  EXPECT_EQ(s2.peak_allocated_bytes, s2.allocated_bytes);
  a.deallocate(large, (3 << 20) + 1);
  a.deallocate(small, 1);
  const CudaMemoryStats s3 = cuda_memory_stats();
  EXPECT_EQ(s3.allocated_bytes, s0.allocated_bytes);
  EXPECT_EQ(s3.peak_allocated_bytes, s2.allocated_bytes);
  EXPECT_EQ(s3.reserved_bytes, s2.reserved_bytes);  // cached, not returned
}

TEST(CudaAllocator, EmptyCacheReturnsFreeSegments) {
  REQUIRE_GPU();
  Allocator& a = allocator_for(gpu());
  void* p = a.allocate(64 << 20);
  const CudaMemoryStats held = cuda_memory_stats();
  a.deallocate(p, 64 << 20);
  cuda_empty_cache();
  const CudaMemoryStats after = cuda_memory_stats();
  EXPECT_LE(after.reserved_bytes, held.reserved_bytes - (64 << 20));
  EXPECT_GT(after.device_frees, held.device_frees);
  // Blocks in use survive empty_cache.
  Tensor t = Tensor::full({1000}, 2.5, DType::f32, gpu());
  cuda_empty_cache();
  EXPECT_EQ(t.to_vector<float>()[999], 2.5f);
}

TEST(CudaAllocator, SplitBlocksMergeBackWhenFreed) {
  REQUIRE_GPU();
  Allocator& a = allocator_for(gpu());
  cuda_empty_cache();
  void* big = a.allocate(16 << 20);
  a.deallocate(big, 16 << 20);
  const int64_t mallocs = cuda_memory_stats().device_mallocs;
  void* x = a.allocate(6 << 20);  // both carved from the cached 16 MiB block
  void* y = a.allocate(8 << 20);
  EXPECT_EQ(cuda_memory_stats().device_mallocs, mallocs);
  a.deallocate(x, 6 << 20);
  a.deallocate(y, 8 << 20);
  void* z = a.allocate(16 << 20);  // merged back into one block
  EXPECT_EQ(z, big);
  EXPECT_EQ(cuda_memory_stats().device_mallocs, mallocs);
  a.deallocate(z, 16 << 20);
}

}  // namespace
}  // namespace trainer
