#pragma once
// The descriptors cuDNN's NHWC batch norm needs for one input shape: the input (NHWC, bf16 or f16),
// the per-channel tensor derived from it, and a ReLU. Shared by the backward (cudnn_batch_norm.cpp)
// and the opt-in forward (cudnn_batch_norm_forward.cpp).
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

}  // namespace trainer::cuda
