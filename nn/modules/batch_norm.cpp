#include "nn/modules/batch_norm.h"

#include <stdexcept>
#include <string>

#include "nn/backend.h"
#include "nn/functional.h"

namespace trainer {

BatchNorm2d::BatchNorm2d(int64_t num_features, double eps, double momentum, bool affine)
    : num_features_(num_features), eps_(eps), momentum_(momentum) {
  if (num_features <= 0)
    throw std::invalid_argument("BatchNorm2d(" + std::to_string(num_features) +
                                "): channel count must be positive");
  if (affine) {
    weight_ = register_parameter("weight", Tensor::empty({num_features}));
    bias_ = register_parameter("bias", Tensor::empty({num_features}));
  }
  running_mean_ = &register_buffer("running_mean", Tensor::empty({num_features}));
  running_var_ = &register_buffer("running_var", Tensor::empty({num_features}));
  num_batches_tracked_ = &register_buffer("num_batches_tracked", Tensor::empty({}, DType::i64));
  reset_parameters();
  reset_running_stats();
}

void BatchNorm2d::reset_parameters() {
  if (weight_.defined()) weight_.data().fill_(1.0);
  if (bias_.defined()) bias_.data().fill_(0.0);
}

void BatchNorm2d::reset_running_stats() {
  running_mean_->fill_(0.0);
  running_var_->fill_(1.0);
  num_batches_tracked_->fill_(0.0);
}

void BatchNorm2d::count_batch() {
  Tensor& count = *num_batches_tracked_;
  if (count.dtype() == DType::i64)
    backend_for(count).add_to_counter(count, 1);
  else  // a buffer loaded in another dtype: count through the host
    count.fill_(count.item() + 1);
}

Variable BatchNorm2d::forward(const Variable& x) { return forward(x, Variable(), false); }

Variable BatchNorm2d::forward(const Variable& x, const Variable& residual, bool relu) {
  if (x.dim() != 4 || x.size(1) != num_features_)
    throw std::invalid_argument("BatchNorm2d(" + std::to_string(num_features_) + ") expects input [N, " +
                                std::to_string(num_features_) + ", H, W], got " + shape_str(x.shape()));
  Variable y;
  if (training_ && training_forward_) {
    y = training_forward_(*this, x);
    if (residual.defined()) y = F::add(y, residual);
    if (relu) y = F::relu(y);
  } else {
    y = F::batch_norm(x, weight_, bias_, *running_mean_, *running_var_, training_, momentum_, eps_, residual,
                      relu);
  }
  if (training_) count_batch();
  return y;
}

}  // namespace trainer
