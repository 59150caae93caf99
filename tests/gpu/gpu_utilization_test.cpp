// trainer_gpu_utilization_ratio on a real GPU: NVML, found through the GPU's PCI bus id, reports a busy
// GPU as busy (matrix products queued back to back for over a second, longer than NVML's sample period).
#include "metrics/gpu_utilization.h"

#include <gtest/gtest.h>

#include <chrono>

#include "app/run/device_setup.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainer {
namespace {

using namespace gpu_test;

TEST(GpuUtilization, ABusyGpuReadsBusy) {
  REQUIRE_GPU();
  const std::string bus_id = gpu_pci_bus_id(gpu());
  ASSERT_FALSE(bus_id.empty());
  const GpuUtilization nvml(bus_id);
  ASSERT_TRUE(nvml.available()) << nvml.why_unavailable();
  Generator gen(3);
  const Tensor a = on_gpu(random({4096, 4096}, gen));
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(1500)) {
    for (int i = 0; i < 20; ++i) dev().matmul(a, a, false, false);
    cuda_synchronize();
  }
  const std::optional<double> busy = nvml.read();
  ASSERT_TRUE(busy.has_value());
  EXPECT_GT(*busy, 0.5);
  EXPECT_LE(*busy, 1.0);
}

}  // namespace
}  // namespace trainer
