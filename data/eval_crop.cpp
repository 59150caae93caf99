#include "data/eval_crop.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/image_codec.h"
#include "data/jpeg_region.h"
#include "data/resized_crop.h"

namespace trainer {
namespace {

// Above this many times the output's pixels, the resize is computed on the crop region only
// (pathologically elongated images would otherwise need a huge intermediate image).
constexpr int64_t kMaxEvalIntermediate = 64;

}  // namespace

void decode_eval_crop(const uint8_t* data, size_t size, int64_t channels, int64_t resize, int64_t crop,
                      uint8_t* hwc_out) {
  if (crop < 1 || resize < crop || (channels != 1 && channels != 3))
    throw std::invalid_argument(
        "decode_eval_crop: needs resize >= crop >= 1 and 1 or 3 channels, got resize " +
        std::to_string(resize) + ", crop " + std::to_string(crop) + ", channels " + std::to_string(channels));
  thread_local DecodedImage decoded;
  thread_local std::vector<uint8_t> resized;
  const ImageInfo info = read_image_info(data, size);
  int64_t resized_height = 0, resized_width = 0;
  resized_shorter_side(info.height, info.width, resize, resized_height, resized_width);
  const double min_scale = std::max(static_cast<double>(resized_height) / static_cast<double>(info.height),
                                    static_cast<double>(resized_width) / static_cast<double>(info.width));
  const CropBox center = center_crop_box(resized_height, resized_width, crop);
  if (info.format == ImageFormat::jpeg) {
    // Only the centre crop's columns are decoded, then resized straight to the output: the same pixels
    // as resizing the whole image and cropping, up to where the resampling grid falls (the box is
    // rounded to whole pixels of the full-size image). The rows below are still read, so that damage
    // anywhere is an error as in a whole decode.
    const CropBox box = scale_box(center, resized_height, resized_width, info.height, info.width);
    thread_local JpegRegion region;
    if (decode_jpeg_region(data, size, channels, box, min_scale, region, true)) {
      resize_region(region.image.pixels.data(), region.image.height, region.image.width, channels,
                    region.crop, hwc_out, crop, crop);
      return;
    }
  }
  decode_image(data, size, channels, decoded, min_scale);
  if (resized_height * resized_width > kMaxEvalIntermediate * crop * crop) {
    const CropBox region = scale_box(center, resized_height, resized_width, decoded.height, decoded.width);
    resize_region(decoded.pixels.data(), decoded.height, decoded.width, channels, region, hwc_out, crop,
                  crop);
    return;
  }
  resized.resize(static_cast<size_t>(resized_height * resized_width * channels));
  resize_region(decoded.pixels.data(), decoded.height, decoded.width, channels,
                {0, 0, decoded.height, decoded.width}, resized.data(), resized_height, resized_width);
  const size_t row = static_cast<size_t>(crop * channels);
  for (int64_t y = 0; y < crop; ++y)
    std::memcpy(hwc_out + y * crop * channels,
                resized.data() + ((center.top + y) * resized_width + center.left) * channels, row);
}

}  // namespace trainer
