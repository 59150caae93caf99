#include "data/augment/histogram.h"

#include <algorithm>
#include <array>
#include <stdexcept>
#include <string>

namespace trainer {

void posterize(uint8_t* hwc, ImageSize size, int bits) {
  if (bits < 0 || bits > 8)
    throw std::invalid_argument("posterize: bits in [0, 8], got " + std::to_string(bits));
  const uint8_t mask = static_cast<uint8_t>(0xFF << (8 - bits));
  for (int64_t i = 0; i < size.bytes(); ++i) hwc[i] &= mask;
}

namespace {

// Every op here maps a byte to a byte: one table of 256, then a branch-free pass.
void apply_table(uint8_t* bytes, int64_t count, const uint8_t (&table)[256]) {
  for (int64_t i = 0; i < count; ++i) bytes[i] = table[bytes[i]];
}

}  // namespace

void solarize(uint8_t* hwc, ImageSize size, double threshold) {
  const float at = static_cast<float>(threshold);
  uint8_t table[256];
  for (int v = 0; v < 256; ++v) table[v] = static_cast<uint8_t>(static_cast<float>(v) >= at ? 255 - v : v);
  apply_table(hwc, size.bytes(), table);
}

void autocontrast(uint8_t* hwc, ImageSize size) {
  const int64_t c = size.channels;
  for (int64_t ch = 0; ch < c; ++ch) {
    uint8_t lo = 255, hi = 0;
    for (int64_t p = 0; p < size.pixels(); ++p) {
      lo = std::min(lo, hwc[p * c + ch]);
      hi = std::max(hi, hwc[p * c + ch]);
    }
    if (lo == hi) continue;  // torchvision: an infinite scale becomes 1 with minimum 0, i.e. unchanged
    const float minimum = lo, scale = 255.0f / (static_cast<float>(hi) - minimum);
    uint8_t table[256];
    for (int v = 0; v < 256; ++v)
      table[v] = static_cast<uint8_t>(std::clamp((static_cast<float>(v) - minimum) * scale, 0.0f, 255.0f));
    for (int64_t p = 0; p < size.pixels(); ++p) hwc[p * c + ch] = table[hwc[p * c + ch]];
  }
}

void equalize(uint8_t* hwc, ImageSize size) {
  const int64_t c = size.channels;
  for (int64_t ch = 0; ch < c; ++ch) {
    std::array<int64_t, 256> histogram{};
    for (int64_t p = 0; p < size.pixels(); ++p) ++histogram[hwc[p * c + ch]];
    int last = 255;
    while (last > 0 && histogram[static_cast<size_t>(last)] == 0) --last;
    int64_t others = 0;  // every pixel but those of the highest level present
    for (int level = 0; level < last; ++level) others += histogram[static_cast<size_t>(level)];
    const int64_t step = others / 255;
    if (step == 0) continue;
    std::array<uint8_t, 256> lut{};
    int64_t cumulative = 0;
    for (int level = 0; level < 256; ++level) {
      // lut[level] is (count below level + step / 2) / step, clamped.
      lut[static_cast<size_t>(level)] =
          static_cast<uint8_t>(std::min<int64_t>(255, (cumulative + step / 2) / step));
      cumulative += histogram[static_cast<size_t>(level)];
    }
    for (int64_t p = 0; p < size.pixels(); ++p) hwc[p * c + ch] = lut[hwc[p * c + ch]];
  }
}

void invert(uint8_t* hwc, ImageSize size) {
  for (int64_t i = 0; i < size.bytes(); ++i) hwc[i] = static_cast<uint8_t>(255 - hwc[i]);
}

}  // namespace trainer
