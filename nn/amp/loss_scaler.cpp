#include "nn/amp/loss_scaler.h"

#include <stdexcept>

#include "nn/backend.h"
#include "nn/functional.h"

namespace trainer {

LossScaler::LossScaler(LossScalerOptions options)
    : options_(options), scale_(options.enabled ? options.init_scale : 1.0) {
  if (options_.enabled &&
      (options_.init_scale <= 0 || options_.growth_factor <= 1 || options_.backoff_factor <= 0 ||
       options_.backoff_factor >= 1 || options_.growth_interval < 1))
    throw std::invalid_argument(
        "LossScaler: need init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1, growth_interval >= 1");
}

Variable LossScaler::scale_loss(const Variable& loss) const {
  return options_.enabled ? F::mul(loss, scale_) : loss;
}

bool LossScaler::unscale_and_check(const std::vector<Variable>& params,
                                   const std::function<bool(bool)>& agree) {
  std::vector<Tensor> grads;
  for (const Variable& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  return unscale_and_check(grads, agree);
}

bool LossScaler::unscale_and_check(const std::vector<Tensor>& grads, const std::function<bool(bool)>& agree) {
  // One flag per device, read once at the end: a read is a host synchronisation.
  std::vector<Tensor> flags;
  for (Tensor g : grads) {  // a handle: scaled in place
    Tensor* flag = nullptr;
    for (Tensor& f : flags)
      if (f.device() == g.device()) flag = &f;
    if (!flag) flag = &flags.emplace_back(Tensor::zeros({1}, DType::i64, g.device()));
    backend_for(g).scale_and_flag_nonfinite(g, options_.enabled ? 1.0 / scale_ : 1.0, *flag);
  }
  bool finite = true;
  for (const Tensor& f : flags) finite = finite && f.to(Device::cpu()).data<int64_t>()[0] == 0;
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
