#include "data/transforms.h"

#include <gtest/gtest.h>

#include <numeric>
#include <set>
#include <utility>
#include <vector>

namespace trainer {
namespace {

// Pixel values 1, 2, 3, ... so that every value (and no zero) is recognisable after a move.
std::vector<uint8_t> numbered_image(ImageSize size) {
  std::vector<uint8_t> image(static_cast<size_t>(size.bytes()));
  std::iota(image.begin(), image.end(), uint8_t{1});
  return image;
}

TEST(Transforms, ShiftMovesContentAndFillsZeros) {
  const ImageSize size{3, 4, 2};
  const std::vector<uint8_t> src = numbered_image(size);
  std::vector<uint8_t> dst(src.size(), 0xee);
  shift_with_zero_fill(src.data(), dst.data(), size, 1, -1);
  const auto at = [&](const std::vector<uint8_t>& image, int64_t y, int64_t x, int64_t c) {
    return image[static_cast<size_t>((y * size.width + x) * size.channels + c)];
  };
  for (int64_t y = 0; y < size.height; ++y) {
    for (int64_t x = 0; x < size.width; ++x) {
      for (int64_t c = 0; c < size.channels; ++c) {
        const bool inside = y + 1 < size.height && x - 1 >= 0;
        EXPECT_EQ(at(dst, y, x, c), inside ? at(src, y + 1, x - 1, c) : 0) << y << "," << x << "," << c;
      }
    }
  }
  shift_with_zero_fill(src.data(), dst.data(), size, 0, 5);  // shifted out entirely
  EXPECT_EQ(dst, std::vector<uint8_t>(src.size(), 0));
}

TEST(Transforms, RandomCropKeepsShapeAndShiftsContentWithinThePadding) {
  const ImageSize size{5, 6, 3};
  const int64_t padding = 2;
  const std::vector<uint8_t> original = numbered_image(size);
  std::set<std::pair<int64_t, int64_t>> shifts_seen;
  std::vector<uint8_t> scratch;
  for (uint64_t seed = 0; seed < 400; ++seed) {
    std::vector<uint8_t> image = original;
    Generator gen(seed);
    random_crop(image.data(), size, padding, gen, scratch);
    ASSERT_EQ(image.size(), original.size());
    // The result must be the original shifted by some (dy, dx) in [-padding, padding]^2.
    bool matched = false;
    for (int64_t dy = -padding; dy <= padding && !matched; ++dy) {
      for (int64_t dx = -padding; dx <= padding && !matched; ++dx) {
        std::vector<uint8_t> expected(original.size());
        shift_with_zero_fill(original.data(), expected.data(), size, dy, dx);
        if (expected == image) {
          matched = true;
          shifts_seen.insert({dy, dx});
        }
      }
    }
    EXPECT_TRUE(matched) << "seed " << seed;
  }
  EXPECT_EQ(shifts_seen.size(), 25u) << "every offset of the padded window should occur";
}

TEST(Transforms, RandomCropWithoutPaddingDrawsNothing) {
  const ImageSize size{2, 2, 1};
  std::vector<uint8_t> image = numbered_image(size), scratch;
  Generator gen(3), untouched(3);
  random_crop(image.data(), size, 0, gen, scratch);
  EXPECT_EQ(image, numbered_image(size));
  EXPECT_EQ(gen.next_u64(), untouched.next_u64());
}

TEST(Transforms, FlipMirrorsPixelsKeepingChannelOrderAndIsItsOwnInverse) {
  const ImageSize size{2, 3, 2};
  std::vector<uint8_t> image = numbered_image(size);
  horizontal_flip(image.data(), size);
  EXPECT_EQ(image, (std::vector<uint8_t>{5, 6, 3, 4, 1, 2, 11, 12, 9, 10, 7, 8}));
  horizontal_flip(image.data(), size);
  EXPECT_EQ(image, numbered_image(size));
}

TEST(Transforms, RandomFlipHappensAboutHalfTheTime) {
  const ImageSize size{1, 2, 1};
  int flips = 0;
  Generator gen(11);
  for (int i = 0; i < 2000; ++i) {
    std::vector<uint8_t> image = {1, 2};
    random_horizontal_flip(image.data(), size, gen);
    flips += image[0] == 2;
  }
  EXPECT_NEAR(flips, 1000, 100);
}

TEST(Transforms, ApplyIsAPureFunctionOfTheGenerator) {
  const ImageSize size{8, 8, 3};
  const TransformConfig config{4, true};
  std::vector<uint8_t> a = numbered_image(size), b = a, scratch;
  Generator gen_a(99), gen_b(99);
  apply_transforms(config, a.data(), size, gen_a, scratch);
  apply_transforms(config, b.data(), size, gen_b, scratch);
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace trainer
