#include "nn/cuda/kernels.cuh"
#include "nn/cuda/normalize_input.h"

namespace trainer::cuda {
namespace {

// Statistics by value in the kernel's parameters: no device allocation or copy per batch.
struct ChannelStats {
  float mean[kMaxNormalizeChannels];
  float std[kMaxNormalizeChannels];
};

// Explicitly rounded operations: the result must not depend on --use_fast_math or contraction.
__device__ __forceinline__ float normalize_value(uint8_t v, float mean, float std) {
  return __fdiv_rn(__fsub_rn(__fdiv_rn(static_cast<float>(v), 255.0f), mean), std);
}

}  // namespace

Tensor normalize_u8_nhwc(const Tensor& u8_nhwc, const std::vector<float>& mean, const std::vector<float>& std,
                         MemoryFormat format) {
  if (u8_nhwc.dtype() != DType::u8 || u8_nhwc.dim() != 4 || !u8_nhwc.device().is_cuda() ||
      !u8_nhwc.is_contiguous())
    throw std::invalid_argument("normalize_u8_nhwc: expected a contiguous u8 [B, H, W, C] GPU tensor, got " +
                                u8_nhwc.str());
  check_device(u8_nhwc, "normalize_u8_nhwc", "input");
  const int64_t batch = u8_nhwc.size(0), height = u8_nhwc.size(1), width = u8_nhwc.size(2),
                channels = u8_nhwc.size(3);
  if (channels > kMaxNormalizeChannels)
    throw std::invalid_argument("normalize_u8_nhwc: at most " + std::to_string(kMaxNormalizeChannels) +
                                " channels, got " + std::to_string(channels));
  const auto fits = [&](const std::vector<float>& stats) {
    return stats.size() == 1 || static_cast<int64_t>(stats.size()) == channels;
  };
  if (!fits(mean) || !fits(std))
    throw std::invalid_argument("normalize_u8_nhwc: mean and std need 1 or " + std::to_string(channels) +
                                " values, got " + std::to_string(mean.size()) + " and " +
                                std::to_string(std.size()));
  ChannelStats stats{};
  for (int64_t c = 0; c < channels; ++c) {
    stats.mean[c] = mean[mean.size() == 1 ? 0 : static_cast<size_t>(c)];
    stats.std[c] = std[std.size() == 1 ? 0 : static_cast<size_t>(c)];
    if (!(stats.std[c] > 0.0f))
      throw std::invalid_argument("normalize_u8_nhwc: std must be positive, got " +
                                  std::to_string(stats.std[c]));
  }

  Tensor output = empty({batch, channels, height, width}, DType::f32, format);  // [B, C, H, W]
  const uint8_t* in = u8_nhwc.data<uint8_t>();
  float* out = output.data<float>();
  const int64_t plane = height * width;
  if (format == MemoryFormat::channels_last) {
    // NHWC in memory, as the input: element i keeps its position and has channel i % C.
    for_each(output.numel(), [=] __device__(int64_t i) {
      const int64_t c = i % channels;
      out[i] = normalize_value(in[i], stats.mean[c], stats.std[c]);
    });
  } else {
    // i walks [B, C, H*W]; the input pixel is [b, p, c] of [B, H*W, C].
    for_each(output.numel(), [=] __device__(int64_t i) {
      const int64_t p = i % plane, c = (i / plane) % channels, b = i / (plane * channels);
      out[i] = normalize_value(in[(b * plane + p) * channels + c], stats.mean[c], stats.std[c]);
    });
  }
  return output;
}

}  // namespace trainer::cuda
