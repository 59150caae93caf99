#include "data/normalize.h"

#include <array>
#include <stdexcept>
#include <string>

namespace trainer {

Tensor to_float_normalized(const Tensor& u8_nhwc, const std::vector<float>& mean,
                           const std::vector<float>& std) {
  if (u8_nhwc.dtype() != DType::u8 || u8_nhwc.dim() != 4 || !u8_nhwc.device().is_cpu()) {
    throw std::invalid_argument("to_float_normalized: expected a u8 [B, H, W, C] CPU tensor, got " +
                                u8_nhwc.str());
  }
  const int64_t batch = u8_nhwc.size(0), height = u8_nhwc.size(1), width = u8_nhwc.size(2),
                channels = u8_nhwc.size(3);
  const auto fits = [&](const std::vector<float>& stats) {
    return stats.size() == 1 || static_cast<int64_t>(stats.size()) == channels;
  };
  if (!fits(mean) || !fits(std)) {
    throw std::invalid_argument("to_float_normalized: mean and std need 1 or " + std::to_string(channels) +
                                " values, got " + std::to_string(mean.size()) + " and " +
                                std::to_string(std.size()));
  }

  // A 256-entry table per channel: the same float32 operations as torchvision (x / 255, then
  // - mean, then / std) done once per value instead of once per pixel.
  std::vector<std::array<float, 256>> table(static_cast<size_t>(channels));
  for (int64_t c = 0; c < channels; ++c) {
    const float m = mean[mean.size() == 1 ? 0 : static_cast<size_t>(c)];
    const float s = std[std.size() == 1 ? 0 : static_cast<size_t>(c)];
    if (!(s > 0.0f))
      throw std::invalid_argument("to_float_normalized: std must be positive, got " + std::to_string(s));
    for (int v = 0; v < 256; ++v) table[static_cast<size_t>(c)][v] = (static_cast<float>(v) / 255.0f - m) / s;
  }

  const Tensor input = u8_nhwc.contiguous();
  Tensor output = Tensor::empty({batch, channels, height, width}, DType::f32);  // [B, C, H, W]
  const uint8_t* in = input.data<uint8_t>();
  float* out = output.data<float>();
  const int64_t plane = height * width;
  for (int64_t b = 0; b < batch; ++b) {
    const uint8_t* image = in + b * plane * channels;  // [H, W, C]
    float* planes = out + b * plane * channels;        // [C, H, W]
    for (int64_t c = 0; c < channels; ++c) {
      const float* lookup = table[static_cast<size_t>(c)].data();
      float* dst = planes + c * plane;
      for (int64_t p = 0; p < plane; ++p) dst[p] = lookup[image[p * channels + c]];
    }
  }
  return output;
}

}  // namespace trainer
