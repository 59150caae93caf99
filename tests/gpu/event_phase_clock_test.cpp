// StepTimer on device events (metrics/event_phase_clock.h): device phases are timed on their streams
// and read one step later. Built with the CUDA backend only; skipped on a machine without a GPU.
#include "metrics/event_phase_clock.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <thread>

namespace trainer {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Device work that takes a measurable time: repeated memsets of a large buffer.
void busy(void* buf, std::size_t bytes, int times, cudaStream_t s) {
  for (int i = 0; i < times; ++i) ASSERT_EQ(cudaMemsetAsync(buf, i & 0xff, bytes, s), cudaSuccess);
}

TEST(EventPhaseClock, TimesDevicePhasesOneStepLater) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t compute = nullptr, comm = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&comm, cudaStreamNonBlocking), cudaSuccess);
  const std::size_t bytes = std::size_t{256} << 20;
  void* buf = nullptr;
  void* comm_buf = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&comm_buf, bytes), cudaSuccess);
  busy(buf, bytes, 2, compute);  // warm up
  ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
  {
    auto clock = std::make_unique<EventPhaseClock>(runtime::Stream(compute), runtime::Stream(comm));
    EventPhaseClock* events = clock.get();
    StepTimer timer(std::move(clock));
    std::vector<StepTimes> resolved;
    std::size_t events_after_two_steps = 0;
    for (int step = 1; step <= 4; ++step) {
      timer.begin_step();
      timer.begin(Phase::data_wait);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      timer.end(Phase::data_wait);
      timer.begin(Phase::forward);
      busy(buf, bytes, 8, compute);
      timer.end(Phase::forward);
      timer.begin(Phase::backward);
      timer.begin(Phase::allreduce_total);
      busy(comm_buf, bytes, 4, comm);
      timer.end(Phase::allreduce_total);
      busy(buf, bytes, 16, compute);
      timer.end(Phase::backward);
      timer.begin(Phase::optimizer);
      busy(buf, bytes, 1, compute);
      timer.end(Phase::optimizer);
      // The host waits for the step's results once (like loss.item()).
      ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(comm), cudaSuccess);
      std::optional<StepTimes> t = timer.end_step();
      EXPECT_EQ(t.has_value(), step > 1) << step;
      if (t) resolved.push_back(*t);
      if (step == 2) events_after_two_steps = events->events_created();
    }
    EXPECT_EQ(events->events_created(), events_after_two_steps) << "events are reused";
    for (const StepTimes& t : timer.flush()) resolved.push_back(t);
    std::printf("EventPhaseClock: %s\n", timer.summary().c_str());
    ASSERT_EQ(resolved.size(), 4u);
    for (std::size_t i = 0; i < resolved.size(); ++i) {
      const StepTimes& t = resolved[i];
      SCOPED_TRACE(i);
      EXPECT_EQ(t.step, static_cast<int64_t>(i + 1));
      EXPECT_GE(t[Phase::data_wait], 0.0015);
      EXPECT_GT(t[Phase::forward], 0.0);
      // Twice the memsets of forward: about twice the time.
      EXPECT_GT(t[Phase::backward], 1.3 * t[Phase::forward]);
      EXPECT_GT(t[Phase::allreduce_total], 0.0);
      EXPECT_GE(t[Phase::step], t[Phase::data_wait] + t[Phase::forward]);
      EXPECT_LT(t[Phase::step], 1.0);
    }
  }
  cudaFree(buf);
  cudaFree(comm_buf);
  cudaStreamDestroy(compute);
  cudaStreamDestroy(comm);
}

}  // namespace
}  // namespace trainer
