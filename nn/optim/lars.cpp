#include "nn/optim/lars.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace trainer {
namespace {

const LarsOptions& validated(const LarsOptions& o) {
  auto check = [](bool ok, const std::string& what, double value) {
    require_option("lars", ok, what, value);
  };
  check(std::isfinite(o.lr) && o.lr >= 0.0, "learning rate (must be >= 0)", o.lr);
  check(std::isfinite(o.momentum) && o.momentum >= 0.0, "momentum (must be >= 0)", o.momentum);
  check(std::isfinite(o.dampening), "dampening", o.dampening);
  check(std::isfinite(o.weight_decay) && o.weight_decay >= 0.0, "weight_decay (must be >= 0)",
        o.weight_decay);
  check(std::isfinite(o.trust_coeff) && o.trust_coeff > 0.0, "trust_coeff (must be > 0)", o.trust_coeff);
  check(std::isfinite(o.eps) && o.eps >= 0.0, "eps (must be >= 0)", o.eps);
  if (o.nesterov && (o.momentum <= 0.0 || o.dampening != 0.0))
    throw std::invalid_argument("lars: nesterov momentum requires momentum > 0 and dampening 0");
  return o;
}

std::vector<std::string> lars_slots(const LarsOptions& o) {
  if (o.momentum == 0.0) return {};
  return {"momentum_buffer"};
}

}  // namespace

Lars::Lars(std::vector<NamedParameter> params, const LarsOptions& options)
    : Optimizer("lars",
                make_param_groups(std::move(params), validated(options).weight_decay,
                                  options.no_decay_bn_bias, options.layer_decay),
                options.lr, lars_slots(options)),
      options_(options) {}

void Lars::update(Variable& param, const ParamGroup& group, ParamState& state) {
  LarsParams p;
  p.lr = group_lr(group);
  p.momentum = options_.momentum;
  p.dampening = options_.dampening;
  p.weight_decay = group.weight_decay;
  p.nesterov = options_.nesterov;
  p.trust_coeff = options_.trust_coeff;
  p.eps = options_.eps;
  p.trust_clip = options_.trust_clip;
  p.device_scalars = current_device_scalars();
  p.skip_if = skip_flag();
  Tensor no_buffer;
  Tensor& buffer = state.slots.empty() ? no_buffer : state.slots[0];
  backend_for(param.data()).lars_step(param.data(), param.grad(), buffer, state.steps == 1, p);
}

}  // namespace trainer
