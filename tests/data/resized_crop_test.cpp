#include "data/resized_crop.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <opencv2/imgproc.hpp>
#include <vector>

#include "nn/random.h"

namespace trainer {
namespace {

TEST(RandomResizedCrop, BoxesStayInsideTheImageAndWithinScaleAndRatio) {
  const RandomResizedCropConfig config;
  int fallbacks = 0;
  for (const auto& [height, width] :
       {std::pair{100, 80}, std::pair{375, 500}, std::pair{32, 32}, std::pair{7, 9}}) {
    for (uint64_t seed = 0; seed < 2000; ++seed) {
      Generator gen(seed);
      bool fell_back = true;
      const CropBox box = random_resized_crop_box(height, width, config, gen, &fell_back);
      ASSERT_GE(box.top, 0);
      ASSERT_GE(box.left, 0);
      ASSERT_GE(box.height, 1);
      ASSERT_GE(box.width, 1);
      ASSERT_LE(box.top + box.height, height);
      ASSERT_LE(box.left + box.width, width);
      if (fell_back) {
        ++fallbacks;
        continue;
      }
      // w and h are rounded from exact values inside the bounds: allow half a pixel each way.
      const double area = static_cast<double>(height) * width;
      EXPECT_GE((box.width + 0.5) * (box.height + 0.5), config.scale_min * area);
      EXPECT_LE((box.width - 0.5) * (box.height - 0.5), config.scale_max * area);
      EXPECT_GE((box.width + 0.5) / (box.height - 0.5), config.ratio_min);
      EXPECT_LE((box.width - 0.5) / (box.height + 0.5), config.ratio_max);
    }
  }
  // With these shapes almost every draw fits at one of the ten attempts.
  EXPECT_LT(fallbacks, 10);
}

TEST(RandomResizedCrop, BoxesCoverTheRangeOfScales) {
  double smallest = 1.0, largest = 0.0;
  for (uint64_t seed = 0; seed < 2000; ++seed) {
    Generator gen(seed);
    const CropBox box = random_resized_crop_box(400, 400, {}, gen);
    const double fraction = static_cast<double>(box.width * box.height) / (400.0 * 400.0);
    smallest = std::min(smallest, fraction);
    largest = std::max(largest, fraction);
  }
  EXPECT_LT(smallest, 0.1);
  EXPECT_GT(largest, 0.9);
}

TEST(RandomResizedCrop, ExtremeRatiosFallBackToTheClampedCentralCrop) {
  for (uint64_t seed = 0; seed < 50; ++seed) {
    Generator gen(seed);
    bool fell_back = false;
    // Wider than 4/3: the full height, width = round(10 * 4/3) = 13, centred.
    EXPECT_EQ(random_resized_crop_box(10, 1000, {}, gen, &fell_back), (CropBox{0, 493, 10, 13}));
    EXPECT_TRUE(fell_back);
    // Taller than 3/4: the full width, height = round(10 / 0.75) = 13, centred.
    EXPECT_EQ(random_resized_crop_box(1000, 10, {}, gen, &fell_back), (CropBox{493, 0, 13, 10}));
    EXPECT_TRUE(fell_back);
  }
  // A ratio inside the range but an impossible scale: the whole image.
  RandomResizedCropConfig too_big;
  too_big.scale_min = 1.5;
  too_big.scale_max = 2.0;
  Generator gen(1);
  bool fell_back = false;
  EXPECT_EQ(random_resized_crop_box(30, 40, too_big, gen, &fell_back), (CropBox{0, 0, 30, 40}));
  EXPECT_TRUE(fell_back);
}

TEST(RandomResizedCrop, FallbackComesAfterExactlyTenAttemptsOfTwoDraws) {
  Generator gen(5), reference(5);
  random_resized_crop_box(10, 1000, {}, gen);
  for (int i = 0; i < 20; ++i) reference.uniform();
  EXPECT_EQ(gen.next_u64(), reference.next_u64());
}

TEST(RandomResizedCrop, SameGeneratorSameBox) {
  Generator a(42), b(42);
  EXPECT_EQ(random_resized_crop_box(375, 500, {}, a), random_resized_crop_box(375, 500, {}, b));
}

TEST(EvalResize, FollowsTorchvisionResizeAndCenterCrop) {
  EXPECT_EQ(eval_resize_size(224), 256);
  EXPECT_EQ(eval_resize_size(32), 36);
  int64_t h = 0, w = 0;
  resized_shorter_side(375, 500, 256, h, w);
  EXPECT_EQ(h, 256);
  EXPECT_EQ(w, 341);  // int(256 * 500 / 375) = int(341.33)
  resized_shorter_side(500, 375, 256, h, w);
  EXPECT_EQ(h, 341);
  EXPECT_EQ(w, 256);
  resized_shorter_side(300, 300, 256, h, w);
  EXPECT_EQ(h, 256);
  EXPECT_EQ(w, 256);
  // Python's round: (9 - 8) / 2 = 0.5 rounds to 0, (11 - 8) / 2 = 1.5 to 2.
  EXPECT_EQ(center_crop_box(9, 18, 8), (CropBox{0, 5, 8, 8}));
  EXPECT_EQ(center_crop_box(11, 8, 8), (CropBox{2, 0, 8, 8}));
  EXPECT_EQ(center_crop_box(256, 341, 224), (CropBox{16, 58, 224, 224}));
}

TEST(ResizeRegion, CopiesAnUnscaledRegionAndAveragesWhenShrinking) {
  // 4 x 6 image, 2 channels, values numbered.
  std::vector<uint8_t> image(4 * 6 * 2);
  std::iota(image.begin(), image.end(), uint8_t{0});
  std::vector<uint8_t> out(2 * 3 * 2);
  resize_region(image.data(), 4, 6, 2, {1, 2, 2, 3}, out.data(), 2, 3);
  for (int y = 0; y < 2; ++y)
    for (int x = 0; x < 3; ++x)
      for (int c = 0; c < 2; ++c) EXPECT_EQ(out[(y * 3 + x) * 2 + c], image[((1 + y) * 6 + 2 + x) * 2 + c]);
  // A constant region stays constant at any size.
  std::vector<uint8_t> flat(40 * 30 * 3, 99);
  std::vector<uint8_t> small(7 * 7 * 3), large(50 * 50 * 3);
  resize_region(flat.data(), 30, 40, 3, {0, 0, 30, 40}, small.data(), 7, 7);
  resize_region(flat.data(), 30, 40, 3, {3, 3, 10, 10}, large.data(), 50, 50);
  for (uint8_t v : small) ASSERT_EQ(v, 99);
  for (uint8_t v : large) ASSERT_EQ(v, 99);
  EXPECT_THROW(resize_region(flat.data(), 30, 40, 3, {25, 0, 10, 10}, small.data(), 7, 7),
               std::invalid_argument);
}

// Shrinking by at most 2x is bilinear (5-7x cheaper than OpenCV's area averaging at non-integer
// ratios); the pixels it gives stay close to area averaging's on photograph-like images.
TEST(ResizeRegion, ShrinkingAtMostTwiceIsBilinearWithinBoundsOfAreaAveraging) {
  Generator gen(3);
  double total = 0, count = 0;
  int largest = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int height = 224 + static_cast<int>(gen.uniform() * 224),
              width = 224 + static_cast<int>(gen.uniform() * 224);
    const double fx = 0.01 + 0.05 * gen.uniform(), fy = 0.01 + 0.05 * gen.uniform();
    cv::Mat image(height, width, CV_8UC3);
    for (int y = 0; y < height; ++y)
      for (int x = 0; x < width; ++x)
        for (int c = 0; c < 3; ++c)
          image.at<cv::Vec3b>(y, x)[c] = cv::saturate_cast<uint8_t>(
              128 + 70 * std::sin(fx * x * (c + 1) + fy * y) + 30 * (gen.uniform() - 0.5));
    std::vector<uint8_t> out(224 * 224 * 3);
    resize_region(image.data, height, width, 3, {0, 0, height, width}, out.data(), 224, 224);
    cv::Mat area;
    cv::resize(image, area, {224, 224}, 0, 0, cv::INTER_AREA);
    for (size_t i = 0; i < out.size(); ++i) {
      const int d = std::abs(static_cast<int>(out[i]) - static_cast<int>(area.data[i]));
      largest = std::max(largest, d);
      total += d;
      ++count;
    }
  }
  EXPECT_LE(total / count, 2.0);  // measured 1.56
  EXPECT_LE(largest, 24);         // measured 17
  // At exactly 2x bilinear is area averaging; beyond 2x area averaging itself is used.
  for (const int factor : {2, 3}) {
    cv::Mat image(8 * factor, 8 * factor, CV_8UC3);
    cv::randu(image, 0, 256);
    std::vector<uint8_t> out(8 * 8 * 3);
    resize_region(image.data, 8 * factor, 8 * factor, 3, {0, 0, 8 * factor, 8 * factor}, out.data(), 8, 8);
    cv::Mat area;
    cv::resize(image, area, {8, 8}, 0, 0, cv::INTER_AREA);
    EXPECT_TRUE(std::equal(out.begin(), out.end(), area.data)) << factor << "x";
  }
}

}  // namespace
}  // namespace trainer
