#include "nn/modules/stochastic_depth.h"

#include <stdexcept>
#include <string>

#include "nn/functional.h"

namespace trainer {

StochasticDepth::StochasticDepth(double p, std::shared_ptr<Generator> gen) : p_(p), gen_(std::move(gen)) {
  if (!(p >= 0.0 && p < 1.0))
    throw std::invalid_argument("StochasticDepth: p must be in [0, 1), got " + std::to_string(p));
  if (!gen_ && p > 0.0) throw std::invalid_argument("StochasticDepth: a Generator is required when p > 0");
}

Variable StochasticDepth::forward(const Variable& x) {
  if (!training_ || p_ == 0.0) return x;
  return F::drop_path(x, p_, training_, *gen_);
}

Variable StochasticDepth::add_scaled_branch(const Variable& x, const Variable& branch,
                                            const Variable& scale) {
  return F::scaled_residual_add(x, branch, scale, p_, training_, gen_.get());
}

}  // namespace trainer
