#include "data/normalize.h"

#include <gtest/gtest.h>

#include <vector>

namespace trainer {
namespace {

TEST(Normalize, ProducesNchwFloatsWithTorchvisionArithmetic) {
  const int64_t B = 2, H = 2, W = 3, C = 3;
  std::vector<uint8_t> pixels(static_cast<size_t>(B * H * W * C));
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 7);
  const Tensor input = Tensor::from_vector(pixels, {B, H, W, C});
  const std::vector<float> mean = {0.4914f, 0.4822f, 0.4465f}, std = {0.2470f, 0.2435f, 0.2616f};

  const Tensor output = to_float_normalized(input, mean, std);
  ASSERT_EQ(output.shape(), (Shape{B, C, H, W}));
  ASSERT_EQ(output.dtype(), DType::f32);
  ASSERT_TRUE(output.is_contiguous());
  const std::vector<float> values = output.to_vector<float>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t w = 0; w < W; ++w) {
          const uint8_t x = pixels[static_cast<size_t>(((b * H + h) * W + w) * C + c)];
          const float expected = (static_cast<float>(x) / 255.0f - mean[c]) / std[c];
          EXPECT_EQ(values[static_cast<size_t>(((b * C + c) * H + h) * W + w)], expected);
        }
}

TEST(Normalize, AcceptsStridedInputAndOneStatisticForAllChannels) {
  // An NCHW u8 tensor viewed as NHWC (not contiguous) gives the same result as its contiguous copy.
  std::vector<uint8_t> pixels(2 * 2 * 3 * 3);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(255 - i);
  const Tensor nhwc_view = Tensor::from_vector(pixels, {2, 2, 3, 3}).permute({0, 2, 3, 1});
  ASSERT_FALSE(nhwc_view.is_contiguous());
  EXPECT_EQ(to_float_normalized(nhwc_view, {0.5f}, {0.25f}).to_vector<float>(),
            to_float_normalized(nhwc_view.contiguous(), {0.5f, 0.5f}, {0.25f, 0.25f}).to_vector<float>());
}

TEST(Normalize, RejectsWrongInputs) {
  const Tensor u8 = Tensor::zeros({1, 2, 2, 3}, DType::u8);
  EXPECT_THROW(to_float_normalized(Tensor::zeros({1, 2, 2, 3}), {0.5f}, {0.5f}), std::invalid_argument);
  EXPECT_THROW(to_float_normalized(Tensor::zeros({2, 2, 3}, DType::u8), {0.5f}, {0.5f}),
               std::invalid_argument);
  EXPECT_THROW(to_float_normalized(u8, {0.5f, 0.5f}, {0.5f}), std::invalid_argument);
  EXPECT_THROW(to_float_normalized(u8, {0.5f}, {0.0f}), std::invalid_argument);
}

}  // namespace
}  // namespace trainer
