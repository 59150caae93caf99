// data/augment/: the properties torchvision parity (ctest torchvision_augment_parity) does not cover:
// determinism per (seed, epoch, index) whatever the number of loader threads, resumed epochs, a fixed
// number of draws per sample, and the semantics of the draws (erasing's box, ColorJitter's order).
#include "data/augment/augment.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "data/augment/colour.h"
#include "data/augment/erasing.h"
#include "data/augment/geometric.h"
#include "data/augment/policies.h"
#include "data/hash.h"
#include "data/loader.h"
#include "data/synthetic.h"
#include "data/transforms.h"

namespace trainer {
namespace {

AugmentConfig every_augmentation(AugmentPolicy policy) {
  AugmentConfig config;
  config.policy = policy;
  config.color_jitter = {0.4, 0.4, 0.4, 0.1};
  config.erasing.probability = 0.5;
  config.erasing.value = ErasingValue::random;
  return config;
}

std::vector<uint8_t> noise_image(ImageSize size, uint64_t seed) {
  Generator gen(seed);
  std::vector<uint8_t> pixels(static_cast<size_t>(size.bytes()));
  for (uint8_t& p : pixels) p = static_cast<uint8_t>(gen.below(256));
  return pixels;
}

std::vector<std::vector<uint8_t>> epoch_images(int workers, int64_t first_batch, AugmentPolicy policy) {
  auto dataset = std::make_shared<SyntheticDataset>(SyntheticConfig{96, 3, 24, 20, 10, 5});
  LoaderOptions options;
  options.batch_size = 16;
  options.seed = 11;
  options.epoch = 3;
  options.num_workers = workers;
  options.first_batch = first_batch;
  options.transforms.crop_padding = 2;
  options.transforms.horizontal_flip = true;
  options.transforms.augment = every_augmentation(policy);
  std::vector<int64_t> indices(96);
  for (int64_t i = 0; i < 96; ++i) indices[static_cast<size_t>(i)] = (i * 37) % 96;
  DataLoader loader(dataset, indices, options);
  std::vector<std::vector<uint8_t>> batches;
  while (std::optional<Batch> batch = loader.next()) {
    const uint8_t* bytes = batch->images.data<uint8_t>();
    batches.emplace_back(bytes, bytes + batch->images.numel());
  }
  return batches;
}

TEST(Augment, SameBytesWhateverTheLoaderThreads) {
  for (AugmentPolicy policy :
       {AugmentPolicy::randaugment, AugmentPolicy::trivialaugment, AugmentPolicy::autoaugment}) {
    const auto inline_load = epoch_images(0, 0, policy);
    EXPECT_EQ(epoch_images(1, 0, policy), inline_load) << to_string(policy);
    EXPECT_EQ(epoch_images(3, 0, policy), inline_load) << to_string(policy);
  }
}

TEST(Augment, ResumedEpochSeesTheSameImages) {
  const auto whole = epoch_images(2, 0, AugmentPolicy::randaugment);
  const auto resumed = epoch_images(2, 4, AugmentPolicy::randaugment);
  ASSERT_EQ(resumed.size() + 4, whole.size());
  for (size_t b = 0; b < resumed.size(); ++b) EXPECT_EQ(resumed[b], whole[b + 4]) << "batch " << b + 4;
}

TEST(Augment, ChangesImagesAndDependsOnTheSeed) {
  const ImageSize size{32, 32, 3};
  const std::vector<uint8_t> original = noise_image(size, 1);
  std::vector<uint8_t> scratch;
  std::set<uint64_t> seen;
  for (uint64_t seed = 0; seed < 16; ++seed) {
    std::vector<uint8_t> image = original;
    Generator gen(seed);
    apply_augment(every_augmentation(AugmentPolicy::randaugment), image.data(), size, gen, scratch);
    seen.insert(fnv1a64_bytes(image.data(), image.size()));
  }
  EXPECT_GE(seen.size(), 14u);  // 16 seeds give (almost) 16 different images
}

// Every policy draws the same count of numbers whatever the image and the ops drawn, so the draws of
// a later transform never depend on an image's content.
TEST(Augment, FixedNumberOfDrawsPerSample) {
  const ImageSize size{20, 24, 3};
  std::vector<uint8_t> scratch;
  for (AugmentPolicy policy :
       {AugmentPolicy::randaugment, AugmentPolicy::trivialaugment, AugmentPolicy::autoaugment}) {
    AugmentConfig config = every_augmentation(policy);
    config.erasing.value = ErasingValue::zero;  // random fill draws as many as the box has bytes
    for (uint64_t seed = 0; seed < 8; ++seed) {
      std::vector<uint8_t> a = noise_image(size, 2), b(a.size(), 128);
      Generator gen_a(seed), gen_b(seed);
      apply_augment(config, a.data(), size, gen_a, scratch);
      apply_augment(config, b.data(), size, gen_b, scratch);
      EXPECT_EQ(gen_a.next_u64(), gen_b.next_u64()) << to_string(policy) << " seed " << seed;
    }
  }
}

TEST(RandomErasing, BoxFollowsTorchvision) {
  RandomErasingConfig config;
  Generator gen(3);
  for (int i = 0; i < 2000; ++i) {
    const ErasingBox box = random_erasing_box(40, 30, config, gen);
    if (box.height == 0) continue;
    EXPECT_LT(box.height, 40);
    EXPECT_LT(box.width, 30);
    EXPECT_GE(box.top, 0);
    EXPECT_GE(box.left, 0);
    EXPECT_LE(box.top + box.height, 40);
    EXPECT_LE(box.left + box.width, 30);
    const double area = static_cast<double>(box.height * box.width) / (40.0 * 30.0);
    EXPECT_LE(area, 0.33 * 1.3);  // rounding of the sides, on a small image
  }
  // A box that can never fit leaves the image alone after 10 attempts.
  config.scale_min = config.scale_max = 1.0;
  config.ratio_min = config.ratio_max = 1.0;
  EXPECT_EQ(random_erasing_box(30, 30, config, gen).height, 0);
}

TEST(RandomErasing, ErasesOnlyTheBox) {
  const ImageSize size{32, 32, 3};
  RandomErasingConfig config;
  config.probability = 1.0;
  int erased = 0;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    std::vector<uint8_t> image(static_cast<size_t>(size.bytes()), 200);
    Generator gen(seed), replay(seed);
    random_erasing(config, image.data(), size, gen);
    replay.uniform();
    const ErasingBox box = random_erasing_box(32, 32, config, replay);
    for (int64_t y = 0; y < 32; ++y)
      for (int64_t x = 0; x < 32; ++x) {
        const bool inside =
            y >= box.top && y < box.top + box.height && x >= box.left && x < box.left + box.width;
        EXPECT_EQ(image[static_cast<size_t>((y * 32 + x) * 3)], inside ? 0 : 200);
      }
    erased += box.height > 0;
  }
  EXPECT_GT(erased, 15);
  config.probability = 0.0;
  std::vector<uint8_t> image(static_cast<size_t>(size.bytes()), 200);
  Generator gen(0);
  random_erasing(config, image.data(), size, gen);
  EXPECT_EQ(image, std::vector<uint8_t>(static_cast<size_t>(size.bytes()), 200));
}

TEST(ColorJitter, ZeroStrengthsLeaveTheImage) {
  const ImageSize size{8, 8, 3};
  std::vector<uint8_t> image = noise_image(size, 4);
  const std::vector<uint8_t> original = image;
  Generator gen(0);
  color_jitter({}, image.data(), size, gen);
  EXPECT_EQ(image, original);
}

// Brightness then contrast differs from contrast then brightness on most images: the order is drawn.
TEST(ColorJitter, OrderIsDrawnPerSample) {
  const ImageSize size{16, 16, 3};
  const std::vector<uint8_t> original = noise_image(size, 5);
  ColorJitterConfig config{0.5, 0.5, 0.0, 0.0};
  std::set<uint64_t> results;
  for (uint64_t seed = 0; seed < 32; ++seed) {
    std::vector<uint8_t> image = original;
    Generator gen(seed);
    color_jitter(config, image.data(), size, gen);
    results.insert(fnv1a64_bytes(image.data(), image.size()));
  }
  EXPECT_GT(results.size(), 20u);
}

TEST(Geometric, TranslationIsAShiftWithZeroFill) {
  const ImageSize size{12, 10, 3};
  const std::vector<uint8_t> original = noise_image(size, 6);
  std::vector<uint8_t> scratch, moved = original, expected(original.size());
  translate_x(moved.data(), size, 3.7, scratch);  // int(3.7) = 3 pixels right
  shift_with_zero_fill(original.data(), expected.data(), size, 0, -3);
  EXPECT_EQ(moved, expected);
  moved = original;
  translate_y(moved.data(), size, -2.2, scratch);  // int(-2.2) = -2: 2 pixels up
  shift_with_zero_fill(original.data(), expected.data(), size, 2, 0);
  EXPECT_EQ(moved, expected);
}

TEST(Geometric, QuarterTurnOfASquareImage) {
  const ImageSize size{6, 6, 1};
  std::vector<uint8_t> image(36), scratch;
  for (int i = 0; i < 36; ++i) image[static_cast<size_t>(i)] = static_cast<uint8_t>(i);
  const std::vector<uint8_t> original = image;
  rotate(image.data(), size, 90.0, scratch);  // counter-clockwise: out(y, x) = in(x, 5 - y)
  for (int y = 0; y < 6; ++y)
    for (int x = 0; x < 6; ++x)
      EXPECT_EQ(image[static_cast<size_t>(y * 6 + x)], original[static_cast<size_t>(x * 6 + 5 - y)]);
}

TEST(Policies, TablesHaveTorchvisionsShape) {
  EXPECT_EQ(randaugment_space(31, 224, 224).size(), 14u);
  EXPECT_EQ(trivial_augment_wide_space(31).size(), 14u);
  EXPECT_EQ(autoaugment_space(224, 224).size(), 14u);
  EXPECT_EQ(autoaugment_imagenet_policy().size(), 25u);
  EXPECT_EQ(torch_linspace(0.0f, 30.0f, 31, 30), 30.0f);
  EXPECT_EQ(torch_linspace(255.0f, 0.0f, 31, 0), 255.0f);
  AugmentConfig bad;
  bad.randaugment_magnitude = 31;
  EXPECT_THROW(check_augment_config(bad), std::invalid_argument);
}

}  // namespace
}  // namespace trainer
