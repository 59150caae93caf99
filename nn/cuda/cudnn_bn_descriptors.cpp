#include "nn/cuda/cudnn_bn_descriptors.h"

#include "nn/cuda/cuda_common.h"

namespace trainer::cuda {

BnDescriptors::~BnDescriptors() {
  if (relu) cudnnDestroyActivationDescriptor(relu);
  if (bn) cudnnDestroyTensorDescriptor(bn);
  if (x) cudnnDestroyTensorDescriptor(x);
}

cudnnStatus_t BnDescriptors::create(const Tensor& t) {
  const cudnnDataType_t type = t.dtype() == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
  cudnnStatus_t st = cudnnCreateTensorDescriptor(&x);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnCreateTensorDescriptor(&bn);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnCreateActivationDescriptor(&relu);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NHWC, type, static_cast<int>(t.size(0)),
                                    static_cast<int>(t.size(1)), static_cast<int>(t.size(2)),
                                    static_cast<int>(t.size(3)));
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnDeriveBNTensorDescriptor(bn, x, kBnMode);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnSetActivationDescriptor(relu, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0);
  return st;
}

bool bn_channel_f32(const Tensor& t, int64_t C) {
  return t.defined() && t.dtype() == DType::f32 && t.dim() == 1 && t.size(0) == C && t.is_contiguous() &&
         t.device() == current_device();
}

}  // namespace trainer::cuda
