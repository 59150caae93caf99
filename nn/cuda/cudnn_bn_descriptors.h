#pragma once
// What cuDNN's NHWC batch norm needs, shared by the backward (cudnn_batch_norm.cpp) and the opt-in
// forward (cudnn_batch_norm_forward.cpp): one input shape's descriptors (the input, NHWC bf16 or f16;
// the per-channel tensor derived from it; a ReLU) and the check of its per-channel operands.
#include <cudnn.h>

#include "nn/tensor.h"

namespace trainer::cuda {

constexpr cudnnBatchNormMode_t kBnMode = CUDNN_BATCHNORM_SPATIAL_PERSISTENT;

struct BnDescriptors {
  cudnnTensorDescriptor_t x = nullptr, bn = nullptr;
  cudnnActivationDescriptor_t relu = nullptr;
  BnDescriptors() = default;
  BnDescriptors(const BnDescriptors&) = delete;
  BnDescriptors& operator=(const BnDescriptors&) = delete;
  ~BnDescriptors();
  // Creates and sets all three for x's shape and dtype; the first failing status, or success.
  cudnnStatus_t create(const Tensor& x);
};

// A dense f32 [C] tensor on the current device: what cuDNN takes for gamma, beta and statistics.
bool bn_channel_f32(const Tensor& t, int64_t C);

}  // namespace trainer::cuda
