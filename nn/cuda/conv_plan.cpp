#include "nn/cuda/conv_plan.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "nn/cuda/cuda_common.h"

namespace trainer::cudnn_conv {
namespace {

constexpr size_t kMinWorkspaceLimit = size_t{256} << 20;

}  // namespace

const char* op_name(ConvOp op) {
  return op == ConvOp::forward ? "fwd" : op == ConvOp::backward_data ? "bwd_data" : "bwd_filter";
}

cudnnDataType_t cudnn_type(DType dtype, const char* op) {
  switch (dtype) {
    case DType::f32:
      return CUDNN_DATA_FLOAT;
    case DType::f64:
      return CUDNN_DATA_DOUBLE;
    case DType::f16:
      return CUDNN_DATA_HALF;
    case DType::bf16:
      return CUDNN_DATA_BFLOAT16;
    default:
      throw std::invalid_argument(std::string(op) + ": needs f32, f64, f16 or bf16, got " +
                                  std::string(dtype_name(dtype)));
  }
}

Tensor workspace(size_t bytes) {
  return Tensor::empty({static_cast<int64_t>(bytes)}, DType::u8, cuda::current_device());
}

size_t workspace_limit(DType dtype, const Shape& xs, const Shape& ws, const Shape& ys) {
  const size_t largest =
      static_cast<size_t>(std::max({shape_numel(xs), shape_numel(ws), shape_numel(ys)})) * dtype_size(dtype);
  return std::max(kMinWorkspaceLimit, 4 * largest);
}

}  // namespace trainer::cudnn_conv
