#include "data/augment/erasing.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace trainer {

const char* to_string(ErasingValue value) { return value == ErasingValue::random ? "random" : "zero"; }

ErasingBox random_erasing_box(int64_t height, int64_t width, const RandomErasingConfig& config,
                              Generator& gen) {
  const double area = static_cast<double>(height) * static_cast<double>(width);
  const double log_ratio_min = std::log(config.ratio_min), log_ratio_max = std::log(config.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double erase_area = area * gen.uniform(config.scale_min, config.scale_max);
    const double aspect_ratio = std::exp(gen.uniform(log_ratio_min, log_ratio_max));
    // Python's round() (halves to even): nearbyint in the default rounding mode.
    const int64_t h = static_cast<int64_t>(std::nearbyint(std::sqrt(erase_area * aspect_ratio)));
    const int64_t w = static_cast<int64_t>(std::nearbyint(std::sqrt(erase_area / aspect_ratio)));
    if (!(h < height && w < width)) continue;
    const int64_t top = static_cast<int64_t>(gen.below(static_cast<uint64_t>(height - h + 1)));
    const int64_t left = static_cast<int64_t>(gen.below(static_cast<uint64_t>(width - w + 1)));
    return {top, left, h, w};
  }
  return {};
}

void random_erasing(const RandomErasingConfig& config, uint8_t* hwc, ImageSize size, Generator& gen) {
  if (!(gen.uniform() < config.probability)) return;
  const ErasingBox box = random_erasing_box(size.height, size.width, config, gen);
  const int64_t c = size.channels;
  for (int64_t y = box.top; y < box.top + box.height; ++y) {
    uint8_t* row = hwc + (y * size.width + box.left) * c;
    const int64_t bytes = box.width * c;
    if (config.value == ErasingValue::zero) {
      std::memset(row, 0, static_cast<size_t>(bytes));
      continue;
    }
    // Eight bytes per draw, lowest first (the same bytes on every platform).
    for (int64_t i = 0; i < bytes; i += 8) {
      uint64_t bits = gen.next_u64();
      for (int64_t k = i; k < std::min<int64_t>(i + 8, bytes); ++k, bits >>= 8)
        row[k] = static_cast<uint8_t>(bits);
    }
  }
}

}  // namespace trainer
