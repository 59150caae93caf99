#include "data/transforms.h"

#include <algorithm>
#include <cstring>

namespace trainer {

void shift_with_zero_fill(const uint8_t* src, uint8_t* dst, ImageSize size, int64_t dy, int64_t dx) {
  const int64_t row_bytes = size.width * size.channels;
  // Columns of dst whose source column x + dx lies inside the image.
  const int64_t x_begin = std::clamp<int64_t>(-dx, 0, size.width);
  const int64_t x_end = std::clamp<int64_t>(size.width - dx, 0, size.width);
  for (int64_t y = 0; y < size.height; ++y) {
    uint8_t* out = dst + y * row_bytes;
    const int64_t source_y = y + dy;
    if (source_y < 0 || source_y >= size.height || x_begin >= x_end) {
      std::memset(out, 0, static_cast<size_t>(row_bytes));
      continue;
    }
    const uint8_t* in = src + source_y * row_bytes;
    std::memset(out, 0, static_cast<size_t>(x_begin * size.channels));
    std::memcpy(out + x_begin * size.channels, in + (x_begin + dx) * size.channels,
                static_cast<size_t>((x_end - x_begin) * size.channels));
    std::memset(out + x_end * size.channels, 0, static_cast<size_t>((size.width - x_end) * size.channels));
  }
}

void random_crop(uint8_t* hwc, ImageSize size, int64_t padding, Generator& gen,
                 std::vector<uint8_t>& scratch) {
  if (padding <= 0) return;
  const uint64_t choices = static_cast<uint64_t>(2 * padding + 1);
  const int64_t top = static_cast<int64_t>(gen.below(choices));
  const int64_t left = static_cast<int64_t>(gen.below(choices));
  if (top == padding && left == padding) return;  // the window is the original image
  scratch.assign(hwc, hwc + size.bytes());
  shift_with_zero_fill(scratch.data(), hwc, size, top - padding, left - padding);
}

void horizontal_flip(uint8_t* hwc, ImageSize size) {
  const int64_t c = size.channels;
  for (int64_t y = 0; y < size.height; ++y) {
    uint8_t* row = hwc + y * size.width * c;
    for (int64_t left = 0, right = size.width - 1; left < right; ++left, --right) {
      std::swap_ranges(row + left * c, row + (left + 1) * c, row + right * c);
    }
  }
}

void random_horizontal_flip(uint8_t* hwc, ImageSize size, Generator& gen) {
  if (gen.uniform() < 0.5) horizontal_flip(hwc, size);
}

void apply_transforms(const TransformConfig& config, uint8_t* hwc, ImageSize size, Generator& gen,
                      std::vector<uint8_t>& scratch) {
  if (config.crop_padding > 0) random_crop(hwc, size, config.crop_padding, gen, scratch);
  if (config.horizontal_flip) random_horizontal_flip(hwc, size, gen);
  if (config.augment.enabled()) apply_augment(config.augment, hwc, size, gen, scratch);
}

}  // namespace trainer
