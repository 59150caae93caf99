#include "data/fashion_mnist.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <string>

#include "data/data_error.h"
#include "data/error_of.h"
#include "data/idx.h"
#include "data/temp_dir.h"

namespace trainer {
namespace {

using testing::error_of;
using testing::TempDir;

bool real_dataset_installed() { return std::filesystem::is_directory(kFashionMnistDefaultRoot); }

// A small Fashion-MNIST lookalike: `count` 28x28 images whose pixels all equal their label.
void write_fake_split(const TempDir& dir, const std::string& prefix, int64_t count, bool gzip) {
  IdxImages images;
  images.count = count;
  images.rows = images.cols = 28;
  std::vector<uint8_t> labels;
  for (int64_t i = 0; i < count; ++i) {
    labels.push_back(static_cast<uint8_t>(i % 10));
    images.pixels.insert(images.pixels.end(), 28 * 28, static_cast<uint8_t>(i % 10));
  }
  const std::string suffix = gzip ? ".gz" : "";
  write_idx_images(dir.file(prefix + "-images-idx3-ubyte" + suffix), images, gzip);
  write_idx_labels(dir.file(prefix + "-labels-idx1-ubyte" + suffix), labels, gzip);
}

TEST(FashionMnist, RealTrainAndTestSplitsLoadWithBalancedLabels) {
  if (!real_dataset_installed())
    GTEST_SKIP() << kFashionMnistDefaultRoot << " absent (dataset-fashion-mnist)";
  for (const auto& [split, expected_size] : {std::pair{"train", 60000}, std::pair{"test", 10000}}) {
    const FashionMnist dataset(kFashionMnistDefaultRoot, split);
    EXPECT_EQ(dataset.size(), expected_size);
    EXPECT_EQ(dataset.channels(), 1);
    EXPECT_EQ(dataset.height(), 28);
    EXPECT_EQ(dataset.width(), 28);
    ASSERT_EQ(dataset.class_names().size(), 10u);
    EXPECT_EQ(dataset.class_names()[9], "Ankle boot");
    std::array<int64_t, 10> histogram{};
    for (int64_t i = 0; i < dataset.size(); ++i) ++histogram[static_cast<size_t>(dataset.label(i))];
    for (int64_t count : histogram) EXPECT_EQ(count, expected_size / 10) << split;
    const std::string prefix = std::string("fashion-mnist/") + split +
                               " size=" + std::to_string(expected_size) +
                               " hwc=28x28x1 classes=[T-shirt/top,";
    EXPECT_EQ(dataset.fingerprint().rfind(prefix, 0), 0u) << dataset.fingerprint();
  }
}

TEST(FashionMnist, RealPixelStatisticsMatchTheStandardNormalization) {
  if (!real_dataset_installed())
    GTEST_SKIP() << kFashionMnistDefaultRoot << " absent (dataset-fashion-mnist)";
  const FashionMnist dataset(kFashionMnistDefaultRoot, "train");
  std::vector<uint8_t> image(28 * 28);
  double sum = 0.0, sum_squares = 0.0;
  for (int64_t i = 0; i < dataset.size(); ++i) {
    dataset.read_into(i, image.data());
    for (uint8_t v : image) {
      sum += v / 255.0;
      sum_squares += (v / 255.0) * (v / 255.0);
    }
  }
  const double n = static_cast<double>(dataset.size()) * 28 * 28;
  const double mean = sum / n;
  EXPECT_NEAR(mean, FashionMnist::kMean, 5e-4);
  EXPECT_NEAR(std::sqrt(sum_squares / n - mean * mean), FashionMnist::kStd, 5e-4);
}

TEST(FashionMnist, FingerprintIsStableAndTellsSplitsApart) {
  TempDir dir;
  write_fake_split(dir, "train", 30, true);
  write_fake_split(dir, "t10k", 20, false);
  const FashionMnist train(dir.path().string(), "train");
  const FashionMnist again(dir.path().string(), "train");
  const FashionMnist test(dir.path().string(), "test");
  EXPECT_EQ(train.fingerprint(), again.fingerprint());
  EXPECT_NE(train.fingerprint(), test.fingerprint());
}

TEST(FashionMnist, ReadsCompressedOrUncompressedFiles) {
  for (const bool gzip : {false, true}) {
    TempDir dir;
    write_fake_split(dir, "t10k", 20, gzip);
    const FashionMnist dataset(dir.path().string(), "test");
    EXPECT_EQ(dataset.size(), 20);
    EXPECT_EQ(dataset.images_path(), dir.file(std::string("t10k-images-idx3-ubyte") + (gzip ? ".gz" : "")));
    const Sample sample = dataset.get(13);
    EXPECT_EQ(sample.label, 3);
    EXPECT_EQ(sample.pixels, std::vector<uint8_t>(28 * 28, 3));
  }
}

TEST(FashionMnist, MissingRootNamesPathWithHint) {
  const std::string message = error_of([] { FashionMnist("/nonexistent/fashion", "train"); });
  EXPECT_EQ(message.rfind("/nonexistent/fashion: no such directory", 0), 0u) << message;
  EXPECT_NE(message.find("HINT: apt-get install dataset-fashion-mnist, or set data.root"), std::string::npos);
}

TEST(FashionMnist, MissingFileNamesPathWithHint) {
  TempDir dir;
  write_fake_split(dir, "train", 10, true);
  std::filesystem::remove(dir.file("train-labels-idx1-ubyte.gz"));
  const std::string message = error_of([&] { FashionMnist(dir.path().string(), "train"); });
  EXPECT_EQ(message.rfind(dir.file("train-labels-idx1-ubyte") + "(.gz): no such file", 0), 0u) << message;
  EXPECT_NE(message.find("HINT: apt-get install dataset-fashion-mnist"), std::string::npos);
}

TEST(FashionMnist, MismatchedCountsAndUnknownSplitAreErrors) {
  TempDir dir;
  write_fake_split(dir, "train", 10, false);
  write_idx_labels(dir.file("train-labels-idx1-ubyte"), {1, 2, 3}, false);
  EXPECT_NE(error_of([&] { FashionMnist(dir.path().string(), "train"); }).find("holds 3 labels but"),
            std::string::npos);
  EXPECT_NE(error_of([&] { FashionMnist(dir.path().string(), "val"); }).find("unknown split 'val'"),
            std::string::npos);
}

TEST(FashionMnist, OutOfRangeIndexThrows) {
  TempDir dir;
  write_fake_split(dir, "train", 10, false);
  const FashionMnist dataset(dir.path().string(), "train");
  std::vector<uint8_t> image(28 * 28);
  EXPECT_THROW(dataset.read_into(10, image.data()), std::out_of_range);
  EXPECT_THROW(dataset.label(-1), std::out_of_range);
}

}  // namespace
}  // namespace trainer
