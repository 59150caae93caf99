#include "nn/modules/linear.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "nn/functional.h"

namespace trainer {

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, Generator& gen)
    : in_features_(in_features), out_features_(out_features) {
  if (in_features <= 0 || out_features <= 0)
    throw std::invalid_argument("Linear(" + std::to_string(in_features) + ", " +
                                std::to_string(out_features) + "): feature counts must be positive");
  weight_ = register_parameter("weight", Tensor::empty({out_features, in_features}));
  if (bias) bias_ = register_parameter("bias", Tensor::empty({out_features}));
  reset_parameters(gen);
}

void Linear::reset_parameters(Generator& gen) {
  init::kaiming_uniform_(weight_.data(), gen, std::sqrt(5.0));
  if (bias_.defined()) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_features_));
    init::uniform_(bias_.data(), -bound, bound, gen);
  }
}

Variable Linear::forward(const Variable& x) {
  if (x.dim() < 1 || x.size(-1) != in_features_)
    throw std::invalid_argument("Linear(" + std::to_string(in_features_) + ", " +
                                std::to_string(out_features_) + ") expects input [..., " +
                                std::to_string(in_features_) + "], got " + shape_str(x.shape()));
  return F::linear(x, weight_, bias_);
}

}  // namespace trainer
