// The collective smoke test behind `trainer doctor`: its checks catch wrong results, and its bus
// bandwidth follows nccl-tests' definition.
#include "dist/collective_smoke.h"

#include <gtest/gtest.h>

#include <chrono>

namespace {

using namespace trainer;

TEST(CollectiveSmoke, ExpectedSumsAndBusBandwidth) {
  // Ranks 0..2 fill element 7 with 1 + 2, 2 + 2, 3 + 2.
  EXPECT_EQ(smoke_fill_value(7, 0), 3.0f);
  EXPECT_EQ(smoke_expected_sum(7, 3), 3.0f + 4.0f + 5.0f);
  EXPECT_TRUE(smoke_matches(12.0f, 7, 3, 0.0f));
  EXPECT_FALSE(smoke_matches(12.0001f, 7, 3, 0.0f));
  EXPECT_TRUE(smoke_matches(12.0001f, 7, 3, kAverageTolerance));
  // 1 GB in 1 s between 2 ranks: each link carries 2(n-1)/n = 1x the bytes.
  EXPECT_DOUBLE_EQ(all_reduce_bus_bandwidth(1000000000, 1.0, 2), 1.0);
  EXPECT_DOUBLE_EQ(all_reduce_bus_bandwidth(1000000000, 1.0, 4), 1.5);
  EXPECT_EQ(all_reduce_bus_bandwidth(1000, 1.0, 1), 0.0);
}

TEST(CollectiveSmoke, CpuCommunicatorBetweenThreeLocalRanks) {
  // 4 KiB takes the all-to-all path, 256 KiB the ring: both are checked.
  const CollectiveSmoke s = cpu_all_reduce_smoke(3, {4u << 10, 256u << 10}, 2, std::chrono::seconds(20));
  EXPECT_TRUE(s.correct) << s.error;
  EXPECT_EQ(s.backend, "tcp");
  EXPECT_EQ(s.ranks, 3);
  ASSERT_EQ(s.timings.size(), 2u);
  EXPECT_EQ(s.timings[1].bytes, 256u << 10);
  EXPECT_GT(s.timings[1].bus_gb_per_s, 0.0);
}

}  // namespace
