// The NVML reader behind trainer_gpu_utilization_ratio says why it is unavailable instead of failing:
// on the CPU, on a machine without the NVIDIA driver's libnvidia-ml.so.1, or for a GPU NVML does not
// know. (It reads a real GPU in tests/gpu/gpu_utilization_test.cpp.)
#include "metrics/gpu_utilization.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace trainer
