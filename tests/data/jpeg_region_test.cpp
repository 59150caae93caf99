// The region decoder against a whole decode at the same DCT scale: the crop's pixels must agree.
#include "data/jpeg_region.h"

#include <gtest/gtest.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <opencv2/imgproc.hpp>
#include <vector>

#include "data/image_codec.h"
#include "data/test_pictures.h"
#include "nn/random.h"

namespace trainer {
namespace {

using testing::encode_420;
using testing::picture;

// max |region decode - whole decode| over the crop, at the scale min_scale picks.
int max_difference(const std::vector<uint8_t>& jpeg, int64_t channels, const CropBox& crop,
                   double min_scale) {
  DecodedImage whole;
  decode_image(jpeg.data(), jpeg.size(), channels, whole, min_scale);
  JpegRegion region;
  EXPECT_TRUE(decode_jpeg_region(jpeg.data(), jpeg.size(), channels, crop, min_scale, region));
  EXPECT_GE(region.crop.left, 0);
  EXPECT_LE(region.crop.left + region.crop.width, region.image.width);
  const ImageInfo info = read_image_info(jpeg.data(), jpeg.size());
  // Where the crop lies in the whole scaled image (the same rounding as the region decoder's).
  const double sy = static_cast<double>(whole.height) / static_cast<double>(info.height);
  const double sx = static_cast<double>(whole.width) / static_cast<double>(info.width);
  const int64_t top = std::clamp<int64_t>(std::llround(crop.top * sy), 0, whole.height - 1);
  const int64_t left = std::clamp<int64_t>(std::llround(crop.left * sx), 0, whole.width - 1);
  EXPECT_EQ(region.crop.height,
            std::clamp<int64_t>(std::llround((crop.top + crop.height) * sy), top + 1, whole.height) - top);
  int worst = 0;
  for (int64_t y = 0; y < region.crop.height; ++y)
    for (int64_t x = 0; x < region.crop.width; ++x)
      for (int64_t c = 0; c < channels; ++c) {
        const int a =
            region.image
                .pixels[((y + region.crop.top) * region.image.width + x + region.crop.left) * channels + c];
        const int b = whole.pixels[((y + top) * whole.width + x + left) * channels + c];
        worst = std::max(worst, std::abs(a - b));
      }
  return worst;
}

TEST(JpegRegion, CropPixelsEqualAWholeDecodeAtEveryScale) {
  const int width = 500, height = 375;  // a typical ImageNet photograph's size
  const std::vector<uint8_t> pixels = picture(width, height);
  const std::vector<uint8_t> jpeg444 = encode_jpeg(pixels.data(), width, height, 3, 90);
  const std::vector<uint8_t> jpeg420 = encode_420(pixels, width, height);
  Generator gen(7);
  for (int trial = 0; trial < 40; ++trial) {
    const CropBox crop = random_resized_crop_box(height, width, RandomResizedCropConfig{}, gen);
    const double min_scale = std::max(224.0 / crop.width, 224.0 / crop.height) * (trial % 2 ? 0.2 : 1.0);
    for (int64_t channels : {3, 1}) {
      EXPECT_EQ(max_difference(jpeg444, channels, crop, min_scale), 0)
          << "4:4:4, crop " << crop.top << "," << crop.left << " " << crop.height << "x" << crop.width;
      EXPECT_EQ(max_difference(jpeg420, channels, crop, min_scale), 0)
          << "4:2:0, crop " << crop.top << "," << crop.left << " " << crop.height << "x" << crop.width;
    }
  }
}

TEST(JpegRegion, ResizedCropEqualsTheWholeDecodesResizedCrop) {
  // What ImageFolder's RandomResizedCrop makes of it: the 224x224 output is the same bytes.
  const int width = 500, height = 375;
  const std::vector<uint8_t> jpeg = encode_420(picture(width, height), width, height);
  Generator gen(11);
  for (int trial = 0; trial < 20; ++trial) {
    const CropBox crop = random_resized_crop_box(height, width, RandomResizedCropConfig{}, gen);
    const double min_scale = std::max(224.0 / crop.width, 224.0 / crop.height);
    DecodedImage whole;
    decode_image(jpeg.data(), jpeg.size(), 3, whole, min_scale);
    const double sy = static_cast<double>(whole.height) / height,
                 sx = static_cast<double>(whole.width) / width;
    const int64_t top = std::clamp<int64_t>(std::llround(crop.top * sy), 0, whole.height - 1);
    const int64_t left = std::clamp<int64_t>(std::llround(crop.left * sx), 0, whole.width - 1);
    const CropBox scaled{
        top, left,
        std::clamp<int64_t>(std::llround((crop.top + crop.height) * sy), top + 1, whole.height) - top,
        std::clamp<int64_t>(std::llround((crop.left + crop.width) * sx), left + 1, whole.width) - left};
    std::vector<uint8_t> expected(224 * 224 * 3), got(224 * 224 * 3);
    resize_region(whole.pixels.data(), whole.height, whole.width, 3, scaled, expected.data(), 224, 224);
    JpegRegion region;
    ASSERT_TRUE(decode_jpeg_region(jpeg.data(), jpeg.size(), 3, crop, min_scale, region));
    resize_region(region.image.pixels.data(), region.image.height, region.image.width, 3, region.crop,
                  got.data(), 224, 224);
    EXPECT_EQ(got, expected) << "crop " << crop.top << "," << crop.left << " " << crop.height << "x"
                             << crop.width;
  }
}

// The fast path (a DCT scale of 1/8, 2/8, 4/8 or 8/8, then bilinear up to 2x) against the slow ideal:
// the crop of the full-size decode averaged down by area. The crop boxes are the same; the pixels
// differ only by the resampling, within these bounds.
TEST(JpegRegion, TheFastPathStaysCloseToAFullSizeDecodeAveragedDown) {
  const int width = 500, height = 375;
  const std::vector<uint8_t> jpeg = encode_420(picture(width, height), width, height);
  DecodedImage full;
  decode_image(jpeg.data(), jpeg.size(), 3, full);
  Generator gen(13);
  double total = 0, count = 0;
  int largest = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const CropBox crop = random_resized_crop_box(height, width, RandomResizedCropConfig{}, gen);
    const double min_scale = std::max(224.0 / crop.width, 224.0 / crop.height);
    std::vector<uint8_t> ideal(224 * 224 * 3), fast(224 * 224 * 3);
    const cv::Mat image(height, width, CV_8UC3, full.pixels.data());
    cv::Mat out(224, 224, CV_8UC3, ideal.data());
    const cv::Rect box(static_cast<int>(crop.left), static_cast<int>(crop.top), static_cast<int>(crop.width),
                       static_cast<int>(crop.height));
    cv::resize(image(box), out, out.size(), 0, 0, min_scale < 1 ? cv::INTER_AREA : cv::INTER_LINEAR);
    JpegRegion region;
    ASSERT_TRUE(decode_jpeg_region(jpeg.data(), jpeg.size(), 3, crop, min_scale, region));
    resize_region(region.image.pixels.data(), region.image.height, region.image.width, 3, region.crop,
                  fast.data(), 224, 224);
    for (size_t i = 0; i < fast.size(); ++i) {
      const int d = std::abs(static_cast<int>(fast[i]) - static_cast<int>(ideal[i]));
      largest = std::max(largest, d);
      total += d;
      ++count;
    }
  }
  std::printf("fast path against full-size area averaging: mean %.3f, max %d\n", total / count, largest);
  EXPECT_LE(total / count, 1.0);  // measured 0.39
  EXPECT_LE(largest, 16);         // measured 9
}

TEST(JpegRegion, ExtraneousBytesBeforeTheEndMarkerAreNotDamage) {
  // "Corrupt JPEG data: N extraneous bytes before marker 0xd9": garbage after the scan, pixels whole
  // (some ImageNet training files are like this). PIL decodes them; so must every decode here.
  const int width = 320, height = 240;
  const std::vector<uint8_t> clean = encode_420(picture(width, height), width, height);
  std::vector<uint8_t> padded = clean;
  ASSERT_EQ(padded[padded.size() - 2], 0xFF);
  ASSERT_EQ(padded[padded.size() - 1], 0xD9);
  padded.insert(padded.end() - 2, {0x12, 0x34, 0x56, 0x00, 0x00});
  DecodedImage a, b;
  decode_image(clean.data(), clean.size(), 3, a, 1.0);
  ASSERT_NO_THROW(decode_image(padded.data(), padded.size(), 3, b, 1.0));
  EXPECT_EQ(a.pixels, b.pixels);
  JpegRegion region;
  const CropBox all{0, 0, height, width};
  EXPECT_NO_THROW(decode_jpeg_region(padded.data(), padded.size(), 3, all, 1.0, region, true));
}

TEST(JpegRegion, CorruptAndTruncatedDataAreErrors) {
  const int width = 320, height = 240;
  const std::vector<uint8_t> pixels = picture(width, height);
  std::vector<uint8_t> jpeg = encode_420(pixels, width, height);
  JpegRegion region;
  const CropBox all{0, 0, height, width};
  std::vector<uint8_t> truncated(jpeg.begin(), jpeg.begin() + static_cast<long>(jpeg.size() / 2));
  EXPECT_THROW(decode_jpeg_region(truncated.data(), truncated.size(), 3, all, 1.0, region), ImageDecodeError);
  std::vector<uint8_t> garbage(jpeg.begin(), jpeg.begin() + 20);
  EXPECT_THROW(decode_jpeg_region(garbage.data(), garbage.size(), 3, all, 1.0, region), ImageDecodeError);
  // Scan data overwritten in the middle: libjpeg warns (corrupt data) and fills in; that is an error.
  std::vector<uint8_t> damaged = jpeg;
  for (size_t i = damaged.size() / 2; i < damaged.size() / 2 + 64; ++i) damaged[i] = 0xFF;
  EXPECT_THROW(decode_jpeg_region(damaged.data(), damaged.size(), 3, all, 1.0, region), ImageDecodeError);
}

}  // namespace
}  // namespace trainer
