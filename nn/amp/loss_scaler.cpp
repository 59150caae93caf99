#include "nn/amp/loss_scaler.h"

#include <stdexcept>

#include "nn/amp/loss_scale_rule.h"
#include "nn/backend.h"
#include "nn/functional.h"

namespace trainer {

LossScaler::LossScaler(LossScalerOptions options)
    : options_(options), scale_(options.enabled ? options.init_scale : 1.0) {
  if (options_.enabled && (options_.init_scale <= 0 || !valid_loss_scale_rule(options_.rule)))
    throw std::invalid_argument(
        "LossScaler: need init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1, growth_interval >= 1");
}

double LossScaler::scale() const { return on_device() ? device_scale_.item() : scale_; }
int64_t LossScaler::growth_tracker() const {
  return on_device() ? static_cast<int64_t>(device_tracker_.item()) : growth_tracker_;
}
int64_t LossScaler::skipped_steps() const {
  return on_device() ? static_cast<int64_t>(device_skipped_.item()) : skipped_steps_;
}

Variable LossScaler::scale_loss(const Variable& loss) const {
  if (!options_.enabled) return loss;
  if (!on_device()) return F::mul(loss, scale_);
  // The scale as a constant operand: its value is read on the device, so a replay scales by the current one.
  return F::mul(loss, Variable(device_scale_.reshape(loss.shape()).to(loss.dtype()), false));
}

bool LossScaler::unscale_and_check(const std::vector<Variable>& params,
                                   const std::function<bool(bool)>& agree) {
  std::vector<Tensor> grads;
  for (const Variable& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  return unscale_and_check(grads, agree);
}

bool LossScaler::unscale_and_check(const std::vector<Tensor>& grads, const std::function<bool(bool)>& agree) {
  if (on_device()) throw std::logic_error("LossScaler::unscale_and_check: the scaler is kept on the device");
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
  if (on_device()) throw std::logic_error("LossScaler::update: the scaler is kept on the device");
  if (apply_loss_scale_rule(options_.rule, found_inf, scale_, growth_tracker_)) ++skipped_steps_;
}

void LossScaler::load_state(double scale, int64_t growth_tracker) {
  if (scale <= 0 || growth_tracker < 0) throw std::invalid_argument("LossScaler::load_state: invalid state");
  scale_ = scale;
  growth_tracker_ = growth_tracker;
  if (on_device()) {
    device_scale_.fill_(scale);
    device_tracker_.fill_(static_cast<double>(growth_tracker));
  }
}

void LossScaler::keep_on_device(Device device) {
  if (!options_.enabled) throw std::logic_error("LossScaler::keep_on_device: the scaler is disabled");
  device_scale_ = Tensor::full({1}, scale_, DType::f32, device);
  device_tracker_ = Tensor::full({1}, static_cast<double>(growth_tracker_), DType::i64, device);
  device_skipped_ = Tensor::full({1}, static_cast<double>(skipped_steps_), DType::f64, device);
  found_inf_ = Tensor::zeros({1}, DType::i64, device);
}

void LossScaler::unscale_on_device(const std::vector<Variable>& params,
                                   const std::function<void(Tensor&)>& agree) {
  if (!on_device()) throw std::logic_error("LossScaler::unscale_on_device: call keep_on_device first");
  for (const Variable& p : params) {
    Tensor g = p.grad();  // a handle: unscaled in place
    if (g.defined()) backend_for(g).unscale_and_flag_nonfinite(g, device_scale_, found_inf_);
  }
  if (agree) agree(found_inf_);
}

const int64_t* LossScaler::found_inf_flag() const {
  if (!on_device()) throw std::logic_error("LossScaler::found_inf_flag: call keep_on_device first");
  return static_cast<const int64_t*>(found_inf_.raw_data());
}

void LossScaler::update_on_device() {
  if (!on_device()) throw std::logic_error("LossScaler::update_on_device: call keep_on_device first");
  backend_for(device_scale_)
      .update_loss_scale(device_scale_, device_tracker_, device_skipped_, found_inf_, options_.rule);
}

}  // namespace trainer
