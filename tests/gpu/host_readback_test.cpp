// HostReadback and StepFence, the two things that let the training loop read losses without stopping
// the device: a value read back is the one the device wrote after all the work queued before it, even
// when that work is long; after a fence the step before it has finished.
#include "app/train/host_readback.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <stdexcept>

#include "nn/backend.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainer {
namespace {

using namespace gpu_test;

// About a hundred milliseconds of matmuls on the compute stream.
void queue_long_work() {
  Tensor a = Tensor::full({2048, 2048}, 1e-3, DType::f32, gpu());
  for (int i = 0; i < 200; ++i) a = dev().matmul(a, a, false, false);
}

TEST(HostReadback, ReturnsTheValueWrittenAfterTheWorkQueuedBeforeIt) {
  REQUIRE_GPU();
  HostReadback readback;
  for (int round = 0; round < 3; ++round) {  // slots are reused once their function is gone
    Tensor t = Tensor::zeros({1}, DType::f32, gpu());
    queue_long_work();
    t.fill_(42.0 + round);
    const auto value = readback.read_later(t);
    t.fill_(-1.0);  // queued after the copy: must not be what is read
    EXPECT_EQ(value(), 42.0 + round);
  }
  // Two in flight at once take two slots.
  Tensor a = Tensor::full({1}, 1.0, DType::f64, gpu()), b = Tensor::full({1}, 2.0, DType::f64, gpu());
  const auto ra = readback.read_later(a);
  const auto rb = readback.read_later(b);
  EXPECT_EQ(rb(), 2.0);
  EXPECT_EQ(ra(), 1.0);
}

TEST(StepFence, AfterAStepIsQueuedTheStepBeforeItHasFinished) {
  REQUIRE_GPU();
  StepFence fence;
  Tensor first = Tensor::zeros({1}, DType::f32, gpu());
  queue_long_work();
  first.fill_(7.0);
  fence.step_queued(gpu());  // step 1 queued: nothing before it to wait for
  queue_long_work();
  fence.step_queued(gpu());  // step 2 queued: waits for step 1
  // Step 1's fill has run; read it without going through the compute stream's queue (step 2 runs on).
  float host = 0;
  ASSERT_EQ(cudaMemcpy(&host, first.raw_data(), sizeof host, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host, 7.0f);
}

// With a failure check (several ranks: Comm::throw_if_failed), a wait behind work that does not end
// ends with the check's error: here the work is only long, and the check fails on its first call.
TEST(HostReadback, AWaitWithAFailureCheckEndsWithItsError) {
  REQUIRE_GPU();
  int checks = 0;
  const WaitCheck failed = [&checks] {
    ++checks;
    throw std::runtime_error("the communicator failed");
  };
  HostReadback readback(failed);
  Tensor t = Tensor::zeros({1}, DType::f32, gpu());
  queue_long_work();
  t.fill_(1.0);
  const auto value = readback.read_later(t);
  EXPECT_THROW(value(), std::runtime_error);
  StepFence fence(failed);
  fence.step_queued(gpu());
  queue_long_work();
  EXPECT_THROW(fence.step_queued(gpu()), std::runtime_error);
  EXPECT_GE(checks, 2);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the work itself finishes on its own
}

}  // namespace
}  // namespace trainer
