#include "nn/modules/dropout.h"

#include <stdexcept>
#include <string>

#include "nn/functional.h"

namespace trainer {

Dropout::Dropout(double p, std::shared_ptr<Generator> gen) : p_(p), gen_(std::move(gen)) {
  if (!(p >= 0.0 && p < 1.0))
    throw std::invalid_argument("Dropout: p must be in [0, 1), got " + std::to_string(p));
  if (!gen_) throw std::invalid_argument("Dropout: a Generator is required");
}

Variable Dropout::forward(const Variable& x) {
  if (!training_ || p_ == 0.0) return x;
  return F::dropout(x, p_, training_, *gen_);
}

}  // namespace trainer
