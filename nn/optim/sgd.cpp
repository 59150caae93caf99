#include "nn/optim/sgd.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "nn/backend.h"

namespace trainer {
namespace {

const SgdOptions& validated(const SgdOptions& o) {
  auto check = [](bool ok, const std::string& what, double value) { require_option("sgd", ok, what, value); };
  check(std::isfinite(o.lr) && o.lr >= 0.0, "learning rate (must be >= 0)", o.lr);
  check(std::isfinite(o.momentum) && o.momentum >= 0.0, "momentum (must be >= 0)", o.momentum);
  check(std::isfinite(o.dampening), "dampening", o.dampening);
  check(std::isfinite(o.weight_decay) && o.weight_decay >= 0.0, "weight_decay (must be >= 0)",
        o.weight_decay);
  if (o.nesterov && (o.momentum <= 0.0 || o.dampening != 0.0))
    throw std::invalid_argument(
        "sgd: nesterov momentum requires momentum > 0 and dampening 0 (got momentum " +
        std::to_string(o.momentum) + ", dampening " + std::to_string(o.dampening) + ")");
  return o;
}

std::vector<std::string> sgd_slots(const SgdOptions& o) {
  if (o.momentum == 0.0) return {};
  return {"momentum_buffer"};
}

}  // namespace

SgdParams sgd_params(const SgdOptions& options, double lr, double weight_decay) {
  SgdParams p;
  p.lr = lr;
  p.momentum = options.momentum;
  p.dampening = options.dampening;
  p.weight_decay = weight_decay;
  p.nesterov = options.nesterov;
  return p;
}

Sgd::Sgd(std::vector<NamedParameter> params, const SgdOptions& options)
    : Optimizer("sgd",
                make_param_groups(std::move(params), validated(options).weight_decay,
                                  options.no_decay_bn_bias, options.layer_decay),
                options.lr, sgd_slots(options)),
      options_(options) {}

void Sgd::update(Variable& param, const ParamGroup& group, ParamState& state) {
  SgdParams p = sgd_params(options_, group_lr(group), group.weight_decay);
  p.device_scalars = current_device_scalars();
  p.skip_if = skip_flag();
  Tensor no_buffer;
  Tensor& buffer = state.slots.empty() ? no_buffer : state.slots[0];
  backend_for(param.data()).sgd_step(param.data(), param.grad(), buffer, state.steps == 1, p);
}

void Sgd::update_group(const ParamGroup& group, const std::vector<Update>& updates) {
  const Tensor& first = updates.front().param->data();
  for (const Update& u : updates)
    if (u.param->data().device() != first.device() || u.param->data().dtype() != first.dtype())
      return Optimizer::update_group(group, updates);  // one launch takes one device and dtype
  // The device scalars (the learning rate) are the same for every parameter of a group.
  SgdParams p = sgd_params(options_, group_lr(group), group.weight_decay);
  p.device_scalars = updates.front().device_scalars;
  p.skip_if = skip_flag();
  std::vector<Backend::SgdUpdate> batch;
  batch.reserve(updates.size());
  for (const Update& u : updates) {
    Tensor* buffer = u.state->slots.empty() ? nullptr : &u.state->slots[0];
    batch.push_back({&u.param->data(), &u.param->grad(), buffer, u.state->steps == 1});
  }
  backend_for(first).sgd_step_many(batch, p);
}

}  // namespace trainer
