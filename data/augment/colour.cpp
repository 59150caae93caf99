#include "data/augment/colour.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace trainer {

namespace {

void check_channels(const char* op, ImageSize size) {
  if (size.channels != 1 && size.channels != 3)
    throw std::invalid_argument(std::string(op) + ": images of 1 or 3 channels, got " +
                                std::to_string(size.channels));
}

// torchvision's _blend on uint8: each product and the sum rounded to float32 as PyTorch's separate
// tensor ops round them (no fused multiply-add: the build does not contract), clamped, truncated.
struct Blend {
  float ratio, rest;
  explicit Blend(double r) : ratio(static_cast<float>(r)), rest(static_cast<float>(1.0 - r)) {}
  uint8_t operator()(float a, float b) const {
    const float first = ratio * a;
    const float second = rest * b;
    return static_cast<uint8_t>(std::clamp(first + second, 0.0f, 255.0f));
  }
};

uint8_t grey_of(const uint8_t* rgb) {
  const float r = 0.2989f * static_cast<float>(rgb[0]);
  const float g = 0.587f * static_cast<float>(rgb[1]);
  const float b = 0.114f * static_cast<float>(rgb[2]);
  return static_cast<uint8_t>((r + g) + b);
}

// The mean of the grey image as torch.mean computes it on the CPU: the sum (exact while below 2^24),
// then a float32 division by the count.
float grey_mean(const uint8_t* hwc, ImageSize size) {
  int64_t sum = 0;
  const int64_t pixels = size.pixels();
  for (int64_t p = 0; p < pixels; ++p) {
    const uint8_t* px = hwc + p * size.channels;
    sum += size.channels == 3 ? grey_of(px) : px[0];
  }
  return static_cast<float>(sum) / static_cast<float>(pixels);
}

}  // namespace

void adjust_brightness(uint8_t* hwc, ImageSize size, double factor) {
  check_channels("adjust_brightness", size);
  const Blend blend(factor);
  // A byte's result depends on the byte alone: a table of 256 blends instead of one per byte.
  uint8_t table[256];
  for (int v = 0; v < 256; ++v) table[v] = blend(static_cast<float>(v), 0.0f);
  for (int64_t i = 0; i < size.bytes(); ++i) hwc[i] = table[hwc[i]];
}

void adjust_saturation(uint8_t* hwc, ImageSize size, double factor) {
  check_channels("adjust_saturation", size);
  if (size.channels == 1) return;
  const Blend blend(factor);
  for (int64_t p = 0; p < size.pixels(); ++p) {
    uint8_t* px = hwc + 3 * p;
    const float grey = grey_of(px);
    for (int c = 0; c < 3; ++c) px[c] = blend(static_cast<float>(px[c]), grey);
  }
}

void adjust_contrast(uint8_t* hwc, ImageSize size, double factor) {
  check_channels("adjust_contrast", size);
  const float mean = grey_mean(hwc, size);
  const Blend blend(factor);
  uint8_t table[256];
  for (int v = 0; v < 256; ++v) table[v] = blend(static_cast<float>(v), mean);
  for (int64_t i = 0; i < size.bytes(); ++i) hwc[i] = table[hwc[i]];
}

void adjust_sharpness(uint8_t* hwc, ImageSize size, double factor, std::vector<uint8_t>& scratch) {
  check_channels("adjust_sharpness", size);
  if (size.height <= 2 || size.width <= 2) return;
  scratch.assign(hwc, hwc + size.bytes());
  const int64_t c = size.channels, row = size.width * c;
  const Blend blend(factor);
  for (int64_t y = 0; y < size.height; ++y) {
    for (int64_t x = 0; x < size.width; ++x) {
      const bool border = y == 0 || x == 0 || y + 1 == size.height || x + 1 == size.width;
      for (int64_t ch = 0; ch < c; ++ch) {
        const uint8_t* centre = scratch.data() + y * row + x * c + ch;
        // The border keeps its pixels as the smoothed image, and is blended with itself all the same:
        // in float32 that can move a level (1.27 x - 0.27 x truncates to x - 1 for some x).
        int64_t smoothed = centre[0];
        if (!border) {
          int64_t sum = 4 * centre[0];
          for (int64_t dy = -1; dy <= 1; ++dy)
            for (int64_t dx = -1; dx <= 1; ++dx) sum += centre[dy * row + dx * c];
          // round(sum / 13): the exact quotient is never a half, so float32's conv2d and this agree.
          smoothed = (2 * sum + 13) / 26;
        }
        hwc[y * row + x * c + ch] = blend(static_cast<float>(centre[0]), static_cast<float>(smoothed));
      }
    }
  }
}

namespace {

struct Hsv {
  float h, s, v;
};

// torchvision's _rgb2hsv, operation for operation in float32.
Hsv rgb_to_hsv(float r, float g, float b) {
  const float maxc = std::max({r, g, b}), minc = std::min({r, g, b});
  const bool equal = maxc == minc;
  const float cr = maxc - minc;
  const float s = cr / (equal ? 1.0f : maxc);
  const float divisor = equal ? 1.0f : cr;
  const float rc = (maxc - r) / divisor, gc = (maxc - g) / divisor, bc = (maxc - b) / divisor;
  const float hr = maxc == r ? bc - gc : 0.0f;
  const float hg = maxc == g && maxc != r ? (2.0f + rc) - bc : 0.0f;
  const float hb = maxc != g && maxc != r ? (4.0f + gc) - rc : 0.0f;
  const float h = (hr + hg) + hb;
  return {std::fmod(h / 6.0f + 1.0f, 1.0f), s, maxc};
}

// torchvision's _hsv2rgb in float32.
void hsv_to_rgb(const Hsv& hsv, float rgb[3]) {
  const float i_float = std::floor(hsv.h * 6.0f);
  const float f = hsv.h * 6.0f - i_float;
  const int i = ((static_cast<int>(i_float) % 6) + 6) % 6;
  const float v = hsv.v;
  const float p = std::clamp(v * (1.0f - hsv.s), 0.0f, 1.0f);
  const float q = std::clamp(v * (1.0f - hsv.s * f), 0.0f, 1.0f);
  const float t = std::clamp(v * (1.0f - hsv.s * (1.0f - f)), 0.0f, 1.0f);
  const float table[6][3] = {{v, t, p}, {q, v, p}, {p, v, t}, {p, q, v}, {t, p, v}, {v, p, q}};
  for (int c = 0; c < 3; ++c) rgb[c] = table[i][c];
}

// torch.remainder(x, 1.0) for floats: fmod, moved into [0, 1) when negative.
float remainder_one(float x) {
  float mod = std::fmod(x, 1.0f);
  if (mod != 0 && mod < 0) mod += 1.0f;
  return mod;
}

}  // namespace

void adjust_hue(uint8_t* hwc, ImageSize size, double factor) {
  check_channels("adjust_hue", size);
  if (factor < -0.5 || factor > 0.5)
    throw std::invalid_argument("adjust_hue: factor in [-0.5, 0.5], got " + std::to_string(factor));
  if (size.channels == 1) return;
  const float shift = static_cast<float>(factor);
  for (int64_t p = 0; p < size.pixels(); ++p) {
    uint8_t* px = hwc + 3 * p;
    Hsv hsv = rgb_to_hsv(px[0] / 255.0f, px[1] / 255.0f, px[2] / 255.0f);
    hsv.h = remainder_one(hsv.h + shift);
    float rgb[3];
    hsv_to_rgb(hsv, rgb);
    for (int c = 0; c < 3; ++c) px[c] = static_cast<uint8_t>(rgb[c] * 255.0f);
  }
}

void color_jitter(const ColorJitterConfig& config, uint8_t* hwc, ImageSize size, Generator& gen) {
  int order[4] = {0, 1, 2, 3};
  for (int i = 3; i > 0; --i) std::swap(order[i], order[gen.below(static_cast<uint64_t>(i) + 1)]);
  const auto factor = [&](double strength) {
    return gen.uniform(std::max(0.0, 1.0 - strength), 1.0 + strength);
  };
  const double brightness = factor(config.brightness);
  const double contrast = factor(config.contrast);
  const double saturation = factor(config.saturation);
  const double hue = gen.uniform(-config.hue, config.hue);
  for (int op : order) {
    if (op == 0 && config.brightness > 0) adjust_brightness(hwc, size, brightness);
    if (op == 1 && config.contrast > 0) adjust_contrast(hwc, size, contrast);
    if (op == 2 && config.saturation > 0) adjust_saturation(hwc, size, saturation);
    if (op == 3 && config.hue > 0) adjust_hue(hwc, size, hue);
  }
}

}  // namespace trainer
