#include "nn/amp/loss_scaler.h"

#include <stdexcept>

#include "nn/backend.h"
#include "nn/functional.h"

namespace trainer {

LossScaler::LossScaler(LossScalerOptions options) : options_(options), scale_(options.enabled ? options.init_scale : 1.0) {
  if (options_.enabled && (options_.init_scale <= 0 || options_.growth_factor <= 1 || options_.backoff_factor <= 0 ||
                           options_.backoff_factor >= 1 || options_.growth_interval < 1))
    throw std::invalid_argument(
        "LossScaler: need init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1, growth_interval >= 1");
}

Variable LossScaler::scale_loss(const Variable& loss) const {
  return options_.enabled ? F::mul(loss, scale_) : loss;
}

bool LossScaler::unscale_and_check(const std::vector<Variable>& params, const std::function<bool(bool)>& agree) {
  bool finite = true;
  for (const Variable& p : params) {
    if (!p.grad().defined()) continue;
    Tensor g = p.grad();
    Backend& k = backend_for(g);
    if (options_.enabled) k.scale(g, 1.0 / scale_);
    finite = finite && k.all_finite(g);
  }
  return agree ? agree(finite) : finite;
}

void LossScaler::update(bool found_inf) {
  if (!options_.enabled) return;
  if (found_inf) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
    ++skipped_steps_;
    return;
  }
  if (++growth_tracker_ == options_.growth_interval) {
    scale_ *= options_.growth_factor;
    growth_tracker_ = 0;
  }
}

void LossScaler::load_state(double scale, int64_t growth_tracker) {
  if (scale <= 0 || growth_tracker < 0) throw std::invalid_argument("LossScaler::load_state: invalid state");
  scale_ = scale;
  growth_tracker_ = growth_tracker;
}

}  // namespace trainer
