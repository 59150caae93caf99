#include "data/synthetic.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "data/data_error.h"

namespace trainer {
namespace {

TEST(Synthetic, SamplesArePureFunctionsOfSeedAndIndex) {
  const SyntheticConfig config{100, 3, 8, 8, 10, 5};
  const SyntheticDataset a(config), b(config);
  SyntheticConfig other = config;
  other.seed = 6;
  const SyntheticDataset c(other);
  EXPECT_EQ(a.fingerprint(), b.fingerprint());
  EXPECT_NE(a.fingerprint(), c.fingerprint());
  for (int64_t i : {0, 1, 57, 99}) {
    EXPECT_EQ(a.get(i).pixels, b.get(i).pixels);
    EXPECT_EQ(a.label(i), b.label(i));
    EXPECT_EQ(a.get(i).pixels.size(), 3u * 8 * 8);
  }
  EXPECT_NE(a.get(0).pixels, a.get(1).pixels);
  EXPECT_NE(a.get(0).pixels, c.get(0).pixels);
  EXPECT_THROW(a.get(100), std::out_of_range);
}

TEST(Synthetic, LabelsAreBalancedAndNormalizationMatchesThePixels) {
  const SyntheticDataset dataset({4000, 2, 4, 4, 10, 1});
  std::vector<int64_t> histogram(10);
  double sum = 0.0, sum_squares = 0.0;
  for (int64_t i = 0; i < dataset.size(); ++i) {
    ++histogram[static_cast<size_t>(dataset.label(i))];
    for (uint8_t v : dataset.get(i).pixels) {
      sum += v / 255.0;
      sum_squares += (v / 255.0) * (v / 255.0);
    }
  }
  for (int64_t count : histogram) EXPECT_NEAR(count, 400, 80);
  const double n = 4000.0 * 2 * 4 * 4;
  const double mean = sum / n, stddev = std::sqrt(sum_squares / n - mean * mean);
  const Normalization stats = dataset.normalization();
  ASSERT_EQ(stats.mean.size(), 2u);
  EXPECT_NEAR(mean, stats.mean[0], 0.01);
  EXPECT_NEAR(stddev, stats.std[1], 0.01);
}

TEST(Synthetic, RejectsBadShapes) {
  EXPECT_THROW(SyntheticDataset({10, 0, 4, 4, 10, 0}), DataError);
  EXPECT_THROW(SyntheticDataset({10, 1, 4, 4, 0, 0}), DataError);
}

}  // namespace
}  // namespace trainer
