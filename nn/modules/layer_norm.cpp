#include "nn/modules/layer_norm.h"

#include <stdexcept>
#include <string>

#include "nn/amp/autocast.h"
#include "nn/functional.h"

namespace trainer {

LayerNorm::LayerNorm(int64_t normalized_size, double eps, bool elementwise_affine, LayerNormOver over)
    : normalized_size_(normalized_size), eps_(eps), over_(over) {
  if (normalized_size <= 0)
    throw std::invalid_argument("LayerNorm(" + std::to_string(normalized_size) + "): size must be positive");
  if (elementwise_affine) {
    weight_ = register_parameter("weight", Tensor::empty({normalized_size}));
    bias_ = register_parameter("bias", Tensor::empty({normalized_size}));
  }
  reset_parameters();
}

void LayerNorm::reset_parameters() {
  if (weight_.defined()) weight_.data().fill_(1.0);
  if (bias_.defined()) bias_.data().fill_(0.0);
}

std::optional<DType> LayerNorm::output_dtype(const Variable& x) const {
  const std::optional<DType> half = autocast_dtype();
  if (output_feeds_matmuls_ && half && x.dtype() == DType::f32) return half;
  return std::nullopt;
}

Variable LayerNorm::forward(const Variable& x) {
  const std::string name = "LayerNorm(" + std::to_string(normalized_size_) + ")";
  if (over_ == LayerNormOver::channels) {
    if (x.dim() != 4 || x.size(1) != normalized_size_)
      throw std::invalid_argument(name + " over channels expects input [N, " +
                                  std::to_string(normalized_size_) + ", H, W], got " + shape_str(x.shape()));
    const bool channels_inner = x.data().suggest_memory_format() == MemoryFormat::channels_last &&
                                x.data().is_contiguous(MemoryFormat::channels_last);
    const Variable in = channels_inner ? x : F::contiguous(x, MemoryFormat::channels_last);
    return F::layer_norm(in, normalized_size_, weight_, bias_, eps_, output_dtype(x));
  }
  if (x.dim() < 1 || x.size(-1) != normalized_size_)
    throw std::invalid_argument(name + " expects input [..., " + std::to_string(normalized_size_) +
                                "], got " + shape_str(x.shape()));
  // A 4-D channels-last tensor has C innermost, not the last dimension: it is made contiguous too.
  const bool last_inner =
      x.data().suggest_memory_format() == MemoryFormat::contiguous && x.data().is_contiguous();
  return F::layer_norm(last_inner ? x : F::contiguous(x), normalized_size_, weight_, bias_, eps_,
                       output_dtype(x));
}

std::pair<Variable, Variable> LayerNorm::forward_after_add(const Variable& x, const Variable& branch) {
  const bool fusable = over_ == LayerNormOver::last_dim && x.shape() == branch.shape() && x.dim() >= 1 &&
                       x.size(-1) == normalized_size_ && x.data().is_contiguous() &&
                       branch.data().is_contiguous() && dtype_size(branch.dtype()) <= dtype_size(x.dtype());
  if (!fusable) {
    const Variable h = F::add(x, branch);
    return {h, forward(h)};
  }
  return F::add_layer_norm(x, branch, normalized_size_, weight_, bias_, eps_, output_dtype(x));
}

}  // namespace trainer
