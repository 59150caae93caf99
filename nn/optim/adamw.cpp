#include "nn/optim/adamw.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "nn/backend.h"
#include "nn/kernel_checks.h"

namespace trainer {
namespace {

const AdamWOptions& validated(const AdamWOptions& o) {
  auto check = [](bool ok, const std::string& what, double value) {
    require_option("adamw", ok, what, value);
  };
  check(std::isfinite(o.lr) && o.lr >= 0.0, "learning rate (must be >= 0)", o.lr);
  check(o.beta1 >= 0.0 && o.beta1 < 1.0, "beta1 (must be in [0, 1))", o.beta1);
  check(o.beta2 >= 0.0 && o.beta2 < 1.0, "beta2 (must be in [0, 1))", o.beta2);
  check(std::isfinite(o.eps) && o.eps >= 0.0, "eps (must be >= 0)", o.eps);
  check(std::isfinite(o.weight_decay) && o.weight_decay >= 0.0, "weight_decay (must be >= 0)",
        o.weight_decay);
  return o;
}

}  // namespace

AdamWParams adamw_params(const AdamWOptions& options, double lr, double weight_decay, int64_t step) {
  AdamWParams p;
  p.lr = lr;
  p.beta1 = options.beta1;
  p.beta2 = options.beta2;
  p.eps = options.eps;
  p.weight_decay = weight_decay;
  p.step = step;
  return p;
}

AdamW::AdamW(std::vector<NamedParameter> params, const AdamWOptions& options)
    : Optimizer("adamw",
                make_param_groups(std::move(params), validated(options).weight_decay,
                                  options.no_decay_bn_bias, options.layer_decay),
                options.lr, {"exp_avg", "exp_avg_sq"}),
      options_(options) {}

void AdamW::update(Variable& param, const ParamGroup& group, ParamState& state) {
  AdamWParams p = adamw_params(options_, group_lr(group), group.weight_decay, state.steps);
  p.device_scalars = current_device_scalars();
  p.skip_if = skip_flag();
  p.applied_steps = current_applied_steps();
  backend_for(param.data()).adamw_step(param.data(), param.grad(), state.slots[0], state.slots[1], p);
}

void AdamW::update_group(const ParamGroup& group, const std::vector<Update>& updates) {
  const Tensor& first = updates.front().param->data();
  for (const Update& u : updates)
    if (u.param->data().device() != first.device() || u.param->data().dtype() != first.dtype())
      return Optimizer::update_group(group, updates);  // one launch takes one device and dtype
  AdamWParams p = adamw_params(options_, group_lr(group), group.weight_decay, 1);
  p.skip_if = skip_flag();
  std::vector<Backend::AdamWUpdate> batch;
  batch.reserve(updates.size());
  for (const Update& u : updates)
    batch.push_back({&u.param->data(), &u.param->grad(), &u.state->slots[0], &u.state->slots[1],
                     u.state->steps, u.device_scalars, u.applied_steps});
  backend_for(first).adamw_step_many(batch, p);
}

void AdamW::device_scalar_values(const ParamGroup& group, int64_t step, double* out) const {
  const AdamWScalars s = adamw_scalars(adamw_params(options_, group_lr(group), group.weight_decay, step));
  out[0] = group_lr(group);
  out[1] = s.step_size;
  out[2] = s.bias_correction2_sqrt;
}

}  // namespace trainer
