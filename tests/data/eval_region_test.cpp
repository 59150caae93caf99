// Evaluation's Resize + CenterCrop decodes only the centre crop's columns of a JPEG: the pixels stay
// within bounds of resizing the whole image and cropping, and damage below the crop is still an error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "data/data_error.h"
#include "data/image_codec.h"
#include "data/image_folder.h"
#include "data/jpeg_region.h"
#include "data/resized_crop.h"
#include "data/temp_dir.h"
#include "data/test_pictures.h"

namespace trainer {
namespace {

using testing::encode_420;
using testing::picture;

namespace fs = std::filesystem;
using testing::TempDir;
using testing::write_bytes;

// What evaluation gave before: the whole image decoded, resized to the shorter side, centre-cropped.
std::vector<uint8_t> resize_then_crop(const std::vector<uint8_t>& jpeg, int64_t size) {
  const ImageInfo info = read_image_info(jpeg.data(), jpeg.size());
  int64_t rh = 0, rw = 0;
  resized_shorter_side(info.height, info.width, eval_resize_size(size), rh, rw);
  DecodedImage whole;
  decode_image(jpeg.data(), jpeg.size(), 3, whole,
               std::max(static_cast<double>(rh) / info.height, static_cast<double>(rw) / info.width));
  std::vector<uint8_t> resized(static_cast<size_t>(rh * rw * 3)), out(static_cast<size_t>(size * size * 3));
  resize_region(whole.pixels.data(), whole.height, whole.width, 3, {0, 0, whole.height, whole.width},
                resized.data(), rh, rw);
  const CropBox c = center_crop_box(rh, rw, size);
  for (int64_t y = 0; y < size; ++y)
    std::copy_n(resized.data() + ((c.top + y) * rw + c.left) * 3, size * 3, out.data() + y * size * 3);
  return out;
}

TEST(EvalRegion, TheCentreCropOfARegionDecodeStaysCloseToResizingTheWholeImage) {
  TempDir dir;
  fs::create_directories(dir.path() / "a");
  const std::vector<std::pair<int, int>> sizes = {
      {500, 375}, {375, 500}, {640, 480}, {300, 300}, {1000, 333}};
  for (size_t i = 0; i < sizes.size(); ++i) {
    const auto [w, h] = sizes[i];
    write_bytes(dir.file("a/" + std::to_string(i) + ".jpg"), encode_jpeg(picture(w, h).data(), w, h, 3, 90));
  }
  ImageFolderOptions options;
  options.image_size = 224;
  const ImageFolder folder(dir.path().string(), options);
  double total = 0, count = 0;
  int largest = 0;
  for (int64_t i = 0; i < folder.size(); ++i) {
    std::vector<uint8_t> got(static_cast<size_t>(folder.sample_bytes()));
    folder.read_into(i, got.data());
    const std::vector<uint8_t> expected = resize_then_crop(testing::read_bytes(folder.path(i)), 224);
    for (size_t k = 0; k < got.size(); ++k) {
      const int d = std::abs(static_cast<int>(got[k]) - static_cast<int>(expected[k]));
      largest = std::max(largest, d);
      total += d;
      ++count;
    }
  }
  std::printf("centre crop of a region decode against resize then crop: mean %.3f, max %d\n", total / count,
              largest);
  // The crop box is rounded to whole pixels of the full-size image: a sub-pixel shift, which shows on
  // this picture's fine texture (measured: mean 1.62, max 20).
  EXPECT_LE(total / count, 2.0);
  EXPECT_LE(largest, 32);
}

TEST(EvalRegion, DamageBelowTheCentreCropIsStillAnError) {
  // A tall image: the centre crop ends two thirds of the way down; the file is cut at 85%.
  const int w = 64, h = 160;
  std::vector<uint8_t> noise(static_cast<size_t>(w * h * 3));
  uint64_t state = 1;
  for (uint8_t& p : noise) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    p = static_cast<uint8_t>(state >> 56);
  }
  const std::vector<uint8_t> jpeg = encode_jpeg(noise.data(), w, h, 3, 90);
  const std::vector<uint8_t> cut(jpeg.begin(), jpeg.begin() + static_cast<long>(jpeg.size() * 85 / 100));
  TempDir dir;
  fs::create_directories(dir.path() / "a");
  write_bytes(dir.file("a/cut.jpg"), cut);
  ImageFolderOptions options;
  options.image_size = 16;
  const ImageFolder folder(dir.path().string(), options);
  // The crop's own rows decode: without reading to the end the damage would go unseen.
  int64_t rh = 0, rw = 0;
  resized_shorter_side(h, w, eval_resize_size(16), rh, rw);
  const CropBox centre = center_crop_box(rh, rw, 16);
  const CropBox box{centre.top * h / rh, 0, (centre.top + 16) * h / rh + 1 - centre.top * h / rh, w};
  JpegRegion region;
  EXPECT_TRUE(decode_jpeg_region(cut.data(), cut.size(), 3, box, 1.0, region));
  EXPECT_THROW(decode_jpeg_region(cut.data(), cut.size(), 3, box, 1.0, region, true), ImageDecodeError);
  std::vector<uint8_t> pixels(static_cast<size_t>(folder.sample_bytes()));
  try {
    folder.read_into(0, pixels.data());
    FAIL() << "a truncated file must not evaluate";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("truncated JPEG"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace trainer
