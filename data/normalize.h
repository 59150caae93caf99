#pragma once
// The bridge from the loader's uint8 NHWC batches to the model's float input: ToTensor + Normalize of
// torchvision in one pass, with the same float32 arithmetic, so inputs match PyTorch's bit for bit.
#include <vector>

#include "nn/tensor.h"

namespace trainer {

// u8 [B, H, W, C] (any strides, CPU) -> f32 [B, C, H, W] contiguous, (x / 255 - mean[c]) / std[c].
// mean and std hold C values, or one value used for every channel. Throws std::invalid_argument on a
// wrong dtype, rank, device or statistics size, or a std that is not positive.
Tensor to_float_normalized(const Tensor& u8_nhwc, const std::vector<float>& mean,
                           const std::vector<float>& std);

}  // namespace trainer
