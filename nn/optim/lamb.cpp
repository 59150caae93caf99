#include "nn/optim/lamb.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "nn/kernel_checks.h"

namespace trainer {
namespace {

const LambOptions& validated(const LambOptions& o) {
  auto check = [](bool ok, const std::string& what, double value) {
    require_option("lamb", ok, what, value);
  };
  check(std::isfinite(o.lr) && o.lr >= 0.0, "learning rate (must be >= 0)", o.lr);
  check(o.beta1 >= 0.0 && o.beta1 < 1.0, "beta1 (must be in [0, 1))", o.beta1);
  check(o.beta2 >= 0.0 && o.beta2 < 1.0, "beta2 (must be in [0, 1))", o.beta2);
  check(std::isfinite(o.eps) && o.eps >= 0.0, "eps (must be >= 0)", o.eps);
  check(std::isfinite(o.weight_decay) && o.weight_decay >= 0.0, "weight_decay (must be >= 0)",
        o.weight_decay);
  check(std::isfinite(o.max_grad_norm) && o.max_grad_norm >= 0.0, "max_grad_norm (must be >= 0)",
        o.max_grad_norm);
  return o;
}

LambParams lamb_params(const LambOptions& o, double lr, double weight_decay, int64_t step) {
  LambParams p;
  p.lr = lr;
  p.beta1 = o.beta1;
  p.beta2 = o.beta2;
  p.eps = o.eps;
  p.weight_decay = weight_decay;
  p.trust_clip = o.trust_clip;
  p.step = step;
  p.max_grad_norm = o.max_grad_norm;
  return p;
}

}  // namespace

Lamb::Lamb(std::vector<NamedParameter> params, const LambOptions& options)
    : Optimizer("lamb",
                make_param_groups(std::move(params), validated(options).weight_decay,
                                  options.no_decay_bn_bias, options.layer_decay),
                options.lr, {"exp_avg", "exp_avg_sq"}),
      options_(options) {}

void Lamb::step() {
  if (options_.max_grad_norm > 0.0) {
    // Every gradient of the step, before any update: timm's _get_clip_grad_norm.
    std::vector<const Tensor*> grads;
    for (const ParamGroup& group : param_groups())
      for (const NamedParameter& p : group.params)
        if (p.param.grad().defined()) grads.push_back(&p.param.grad());
    if (!grads.empty()) {
      if (!grad_sq_norm_.defined()) grad_sq_norm_ = Tensor::zeros({1}, DType::f64, grads.front()->device());
      grad_sq_norm_.fill_(0.0);
      backend_for(grad_sq_norm_).add_squared_norms(grads, grad_sq_norm_);
    }
  }
  Optimizer::step();
}

void Lamb::update(Variable& param, const ParamGroup& group, ParamState& state) {
  LambParams p = lamb_params(options_, group_lr(group), group.weight_decay, state.steps);
  p.device_scalars = current_device_scalars();
  p.skip_if = skip_flag();
  p.applied_steps = current_applied_steps();
  if (options_.max_grad_norm > 0.0) p.grad_sq_norm = static_cast<const double*>(grad_sq_norm_.raw_data());
  backend_for(param.data()).lamb_step(param.data(), param.grad(), state.slots[0], state.slots[1], p);
}

void Lamb::device_scalar_values(const ParamGroup& group, int64_t step, double* out) const {
  const LambScalars s = lamb_scalars(lamb_params(options_, group_lr(group), group.weight_decay, step), step);
  out[0] = group_lr(group);
  out[1] = s.bias_correction1;
  out[2] = s.bias_correction2_sqrt;
}

}  // namespace trainer
