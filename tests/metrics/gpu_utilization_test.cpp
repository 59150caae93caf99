// The NVML reader behind trainer_gpu_utilization_ratio says why it is unavailable instead of failing:
// on the CPU, on a machine without the NVIDIA driver's libnvidia-ml.so.1, or for a GPU NVML does not
// know. (It reads a real GPU in tests/gpu/gpu_utilization_test.cpp.) And the thread that reads it.
#include "metrics/gpu_utilization.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace trainer {
namespace {

TEST(GpuUtilization, UnavailableWithAReasonWithoutAGpu) {
  const GpuUtilization none("");
  EXPECT_FALSE(none.available());
  EXPECT_EQ(none.why_unavailable(), "no GPU");
  EXPECT_FALSE(none.read().has_value());
  // A bus id no machine has: either NVML is missing here, or it has no such GPU.
  const GpuUtilization bogus("00ff:ff:1f.7");
  EXPECT_FALSE(bogus.available());
  const std::string why = bogus.why_unavailable();
  EXPECT_TRUE(why.find("libnvidia-ml.so.1") != std::string::npos ||
              why.find("00ff:ff:1f.7") != std::string::npos || why.find("nvmlInit") != std::string::npos)
      << why;
  EXPECT_FALSE(bogus.read().has_value());
}

// The reader publishes every reading on its own thread, NaN when a read gives nothing, and stops when
// destroyed (its destructor wakes and joins the thread).
TEST(PeriodicReader, PublishesEachReadingAndNaNForAFailedOneUntilDestroyed) {
  std::mutex mutex;
  std::vector<double> published;
  int reads = 0;
  {
    PeriodicReader reader(
        [&]() -> std::optional<double> {
          std::lock_guard<std::mutex> lock(mutex);
          ++reads;
          return reads == 2 ? std::nullopt : std::optional<double>(0.25 * reads);
        },
        [&](double v) {
          std::lock_guard<std::mutex> lock(mutex);
          published.push_back(v);
        },
        std::chrono::milliseconds(5));
    for (int i = 0; i < 400; ++i) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (published.size() >= 3) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  std::lock_guard<std::mutex> lock(mutex);
  ASSERT_GE(published.size(), 3u);
  EXPECT_EQ(published[0], 0.25);
  EXPECT_TRUE(std::isnan(published[1]));
  EXPECT_EQ(published[2], 0.75);
  // Destroyed in the middle of a long period, the reader stops at once (its thread is woken, not left
  // to sleep the period out: this test would hang for ten minutes otherwise).
  PeriodicReader idle([] { return std::optional<double>(1.0); }, [](double) {}, std::chrono::minutes(10));
}

}  // namespace
}  // namespace trainer
