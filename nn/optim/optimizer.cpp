#include "nn/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <stdexcept>

#include "nn/backend.h"
#include "nn/optim/layer_decay.h"

namespace trainer {

void require_option(const char* owner, bool ok, const std::string& what, double value) {
  if (!ok)
    throw std::invalid_argument(std::string(owner) + ": invalid " + what + " " + std::to_string(value));
}
namespace {

// The one device every parameter is on; throws naming the first that is elsewhere.
Device parameters_device(const std::string& optimizer, const std::vector<ParamGroup>& groups,
                         const char* what) {
  const Device device = groups.front().params.front().param.data().device();
  for (const ParamGroup& group : groups)
    for (const NamedParameter& p : group.params)
      if (p.param.data().device() != device)
        throw std::invalid_argument(optimizer + ": " + what + " needs every parameter on one device; '" +
                                    p.name + "' is on " + p.param.data().device().str() + ", not " +
                                    device.str());
  return device;
}

bool is_bias_name(const std::string& name) {
  return name == "bias" || (name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0);
}

// timm's rule, as DeiT and ConvNeXt train: no weight decay on what is a vector in effect (norms' scales
// and shifts, biases, ViT's class token [1, 1, D], ConvNeXt's layer scale [C, 1, 1]) nor on ViT's
// position embedding (timm's no_weight_decay list: pos_embed, cls_token).
bool excluded_from_weight_decay(const std::string& name, const Shape& shape) {
  int dims_over_one = 0;
  for (int64_t extent : shape) dims_over_one += extent > 1 ? 1 : 0;
  const std::string pos = "pos_embedding";
  const bool position_embedding =
      name.size() >= pos.size() && name.compare(name.size() - pos.size(), pos.size(), pos) == 0;
  return dims_over_one <= 1 || is_bias_name(name) || position_embedding;
}

// Fresh storage with the parameter's shape, dtype, device and layout.
Tensor empty_like(const Tensor& t) {
  return Tensor::empty(t.shape(), t.dtype(), t.device(), t.suggest_memory_format());
}

std::string entry_name(const std::string& slot, const std::string& param) { return slot + "." + param; }

}  // namespace

std::vector<ParamGroup> make_param_groups(std::vector<NamedParameter> params, double weight_decay,
                                          bool no_decay_bn_bias, double layer_decay) {
  if (layer_decay > 0.0)
    return split_by_layer(make_param_groups(std::move(params), weight_decay, no_decay_bn_bias), layer_decay);
  if (!no_decay_bn_bias) return {ParamGroup{"default", std::move(params), weight_decay}};
  ParamGroup decay{"decay", {}, weight_decay}, no_decay{"no_decay", {}, 0.0};
  for (NamedParameter& p : params) {
    const bool skip = p.param.defined() && excluded_from_weight_decay(p.name, p.param.data().shape());
    (skip ? no_decay : decay).params.push_back(std::move(p));
  }
  std::vector<ParamGroup> groups;
  if (!decay.params.empty()) groups.push_back(std::move(decay));
  if (!no_decay.params.empty()) groups.push_back(std::move(no_decay));
  return groups;
}

Optimizer::Optimizer(std::string name, std::vector<ParamGroup> groups, double lr,
                     std::vector<std::string> slots)
    : name_(std::move(name)), groups_(std::move(groups)), slots_(std::move(slots)) {
  std::set<std::string> names;
  std::set<const VariableImpl*> impls;
  size_t count = 0;
  for (const ParamGroup& group : groups_) {
    for (const NamedParameter& p : group.params) {
      if (!p.param.defined())
        throw std::invalid_argument(name_ + ": parameter '" + p.name + "' is undefined");
      if (!names.insert(p.name).second)
        throw std::invalid_argument(name_ + ": parameter name '" + p.name + "' appears twice");
      if (!impls.insert(p.param.impl()).second)
        throw std::invalid_argument(name_ + ": parameter '" + p.name +
                                    "' is the same variable as another one");
    }
    count += group.params.size();
    states_.emplace_back(group.params.size());
  }
  if (count == 0) throw std::invalid_argument(name_ + ": got an empty parameter list");
  set_lr(lr);
}

void Optimizer::set_lr(double lr) {
  if (!std::isfinite(lr) || lr < 0.0)
    throw std::invalid_argument(name() + ": invalid learning rate " + std::to_string(lr) + " (must be >= 0)");
  lr_ = lr;
}

void Optimizer::step() {
  ++step_count_;
  size_t flat = 0;  // the parameter's index over all groups: its row of device_scalars_ and applied_steps_
  std::vector<int64_t> applied_rows;
  updated_.resize(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    updated_[g].assign(groups_[g].params.size(), 0);
    std::vector<Update> updates;
    for (size_t i = 0; i < groups_[g].params.size(); ++i, ++flat) {
      NamedParameter& named = groups_[g].params[i];
      Variable& param = named.param;
      const Tensor& grad = param.grad();
      if (!grad.defined()) continue;
      if (grad.shape() != param.shape() || grad.device() != param.device())
        throw std::invalid_argument(name() + ": gradient " + grad.str() + " of parameter '" + named.name +
                                    "' does not match its data " + param.data().str());
      ParamState& state = states_[g][i];
      if (state.steps == 0) {
        state.slots.resize(slots_.size());
        for (Tensor& slot : state.slots) {
          if (!slot.defined()) slot = empty_like(param.data());
          slot.zero_();
        }
      }
      ++state.steps;
      updated_[g][i] = 1;
      const double* scalars =
          device_scalars_.defined()
              ? static_cast<const double*>(device_scalars_.raw_data()) + flat * kMaxDeviceScalars
              : nullptr;
      const int64_t* applied =
          applied_steps_.defined() ? static_cast<const int64_t*>(applied_steps_.raw_data()) + flat : nullptr;
      if (applied) applied_rows.push_back(static_cast<int64_t>(flat));
      updates.push_back({&param, &state, scalars, applied});
    }
    if (!updates.empty()) update_group(groups_[g], updates);
  }
  // After every update read its count: then advance the counts of the updates applied.
  if (!applied_rows.empty())
    backend_for(applied_steps_).count_updates(applied_steps_, applied_rows, skip_flag_);
}

void Optimizer::update_group(const ParamGroup& group, const std::vector<Update>& updates) {
  for (const Update& u : updates) {
    current_device_scalars_ = u.device_scalars;
    current_applied_steps_ = u.applied_steps;
    update(*u.param, group, *u.state);
  }
  current_device_scalars_ = nullptr;
  current_applied_steps_ = nullptr;
}

void Optimizer::device_scalar_values(const ParamGroup& group, int64_t, double* out) const {
  out[0] = group_lr(group);
}

void Optimizer::use_device_scalars() {
  size_t count = 0;
  Device device = Device::cpu();
  for (const ParamGroup& group : groups_) {
    for (const NamedParameter& p : group.params) {
      if (!p.param.data().device().is_cuda() || (count > 0 && p.param.data().device() != device))
        throw std::invalid_argument(name_ + ": device scalars need every parameter on one CUDA device; '" +
                                    p.name + "' is on " + p.param.data().device().str());
      device = p.param.data().device();
      ++count;
    }
  }
  device_scalars_ = Tensor::zeros({static_cast<int64_t>(count * kMaxDeviceScalars)}, DType::f64, device);
  host_scalars_ = Tensor::zeros(device_scalars_.shape(), DType::f64);
}

void Optimizer::stage_device_scalars() {
  if (!device_scalars_.defined())
    throw std::logic_error(name_ + ": stage_device_scalars before use_device_scalars");
  double* values = host_scalars_.data<double>();
  size_t flat = 0;
  for (size_t g = 0; g < groups_.size(); ++g)
    for (size_t i = 0; i < groups_[g].params.size(); ++i, ++flat)
      device_scalar_values(groups_[g], states_[g][i].steps + 1, values + flat * kMaxDeviceScalars);
  // From pageable memory: the copy stages the bytes before it returns, so the next step may refill them.
  device_scalars_.copy_(host_scalars_);
}

void Optimizer::count_replayed_step() {
  ++step_count_;
  for (size_t g = 0; g < updated_.size(); ++g)
    for (size_t i = 0; i < updated_[g].size(); ++i)
      if (updated_[g][i]) ++states_[g][i].steps;
}

void Optimizer::zero_grad() {
  for (ParamGroup& group : groups_)
    for (NamedParameter& p : group.params) p.param.zero_grad();
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state_tensors() const {
  std::vector<std::pair<std::string, Tensor>> out;
  if (slots_.empty()) return out;
  const std::vector<std::vector<int64_t>> applied = applied_counts();
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      const NamedParameter& named = groups_[g].params[i];
      const ParamState& state = states_[g][i];
      for (size_t k = 0; k < slots_.size(); ++k) {
        // A copy, so that a checkpoint written later (or asynchronously) sees this step's state.
        Tensor t = k < state.slots.size() && state.slots[k].defined()
                       ? state.slots[k].clone(state.slots[k].suggest_memory_format())
                       : empty_like(named.param.data());
        if (state.steps == 0) t.zero_();
        out.emplace_back(entry_name(slots_[k], named.name), std::move(t));
      }
      out.emplace_back(entry_name("step", named.name),
                       Tensor::scalar(static_cast<double>(applied[g][i]), DType::i64));
    }
  }
  return out;
}

void Optimizer::load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t step_count) {
  const std::string where = name() + " state: ";
  if (step_count < 0)
    throw std::invalid_argument(where + "negative step count " + std::to_string(step_count));
  std::map<std::string, const Tensor*> given;
  for (const auto& [key, tensor] : state) {
    if (!given.emplace(key, &tensor).second)
      throw std::invalid_argument(where + "duplicate entry '" + key + "'");
    if (!tensor.defined()) throw std::invalid_argument(where + "entry '" + key + "' is an undefined tensor");
  }
  auto take = [&](const std::string& key) -> const Tensor& {
    auto it = given.find(key);
    if (it == given.end()) throw std::invalid_argument(where + "missing entry '" + key + "'");
    const Tensor& t = *it->second;
    given.erase(it);
    return t;
  };

  // Validate everything before changing anything.
  std::vector<std::vector<int64_t>> steps(groups_.size());
  std::vector<std::vector<std::vector<const Tensor*>>> slots(groups_.size());
  if (!slots_.empty()) {
    for (size_t g = 0; g < groups_.size(); ++g) {
      for (const NamedParameter& named : groups_[g].params) {
        std::vector<const Tensor*> tensors;
        for (const std::string& slot : slots_) {
          const std::string key = entry_name(slot, named.name);
          const Tensor& t = take(key);
          if (t.shape() != named.param.shape())
            throw std::invalid_argument(where + "entry '" + key + "' has shape " + shape_str(t.shape()) +
                                        ", the parameter has " + shape_str(named.param.shape()));
          tensors.push_back(&t);
        }
        const std::string key = entry_name("step", named.name);
        const Tensor& t = take(key);
        if (t.numel() != 1)
          throw std::invalid_argument(where + "entry '" + key + "' must hold one value, has shape " +
                                      shape_str(t.shape()));
        const double value = t.item();
        if (!(value >= 0.0) || value != std::floor(value))
          throw std::invalid_argument(where + "entry '" + key + "' must be a non-negative integer, is " +
                                      std::to_string(value));
        steps[g].push_back(static_cast<int64_t>(value));
        slots[g].push_back(std::move(tensors));
      }
    }
  }
  if (!given.empty()) {
    std::string expected = slots_.empty() ? "none" : "";
    for (size_t k = 0; k < slots_.size(); ++k) expected += slots_[k] + ".<param>, ";
    if (!slots_.empty()) expected += "step.<param>";
    throw std::invalid_argument(where + "unexpected entry '" + given.begin()->first + "' (" + name() +
                                " expects: " + expected + ")");
  }

  for (size_t g = 0; g < groups_.size() && !slots_.empty(); ++g) {
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      ParamState& st = states_[g][i];
      st.slots.resize(slots_.size());
      for (size_t k = 0; k < slots_.size(); ++k) {
        if (!st.slots[k].defined()) st.slots[k] = empty_like(groups_[g].params[i].param.data());
        st.slots[k].copy_(*slots[g][i][k]);
      }
      st.steps = steps[g][i];
    }
  }
  step_count_ = step_count;
  if (applied_steps_.defined()) applied_steps_.copy_(host_step_counts());
}

Tensor clip_grad_norm_on_device(const std::vector<Variable>& params, double max_norm) {
  if (!std::isfinite(max_norm) || max_norm < 0.0)
    throw std::invalid_argument("clip_grad_norm: max_norm must be finite and >= 0, got " +
                                std::to_string(max_norm));
  std::vector<Tensor*> grads;
  for (const Variable& v : params) {
    if (!v.defined()) throw std::invalid_argument("clip_grad_norm: undefined variable");
    if (!v.grad().defined()) continue;
    Tensor& g = v.impl()->grad;  // the parameter's own gradient, scaled in place
    if (!g.is_contiguous(g.suggest_memory_format())) g = g.contiguous(g.suggest_memory_format());
    if (!grads.empty() && g.device() != grads.front()->device())
      throw std::invalid_argument("clip_grad_norm: gradients on " + grads.front()->device().str() + " and " +
                                  g.device().str() + "; clip each device's parameters apart");
    grads.push_back(&g);
  }
  if (grads.empty()) return Tensor::zeros({1}, DType::f64);
  Tensor norm = Tensor::empty({1}, DType::f64, grads.front()->device());
  backend_for(norm).clip_by_total_norm(grads, max_norm, norm);
  return norm;
}

double clip_grad_norm(const std::vector<Variable>& params, double max_norm) {
  return clip_grad_norm_on_device(params, max_norm).item();
}

void Optimizer::skip_if(const int64_t* device_flag) {
  if (device_flag && !skips_exactly_on_device())
    throw std::logic_error(name_ +
                           ": cannot skip steps on the device flag exactly (see skips_exactly_on_device)");
  skip_flag_ = device_flag;
  if (applied_steps_.defined()) {
    // Counting on the device until now: its counts are the true ones (the host's include skipped steps).
    const std::vector<std::vector<int64_t>> applied = applied_counts();
    for (size_t g = 0; g < states_.size(); ++g)
      for (size_t i = 0; i < states_[g].size(); ++i) states_[g][i].steps = applied[g][i];
    applied_steps_ = Tensor();
  }
  if (!device_flag || !counts_updates_on_device()) return;
  applied_steps_ = host_step_counts().to(parameters_device(name_, groups_, "skip_if"));
}

Tensor Optimizer::host_step_counts() const {
  size_t count = 0;
  for (const ParamGroup& group : groups_) count += group.params.size();
  Tensor out = Tensor::zeros({static_cast<int64_t>(count)}, DType::i64);
  int64_t* c = out.data<int64_t>();
  for (const auto& group_states : states_)
    for (const ParamState& st : group_states) *c++ = st.steps;
  return out;
}

std::vector<std::vector<int64_t>> Optimizer::applied_counts() const {
  std::vector<std::vector<int64_t>> out(states_.size());
  const Tensor device_counts = applied_steps_.defined() ? applied_steps_.to(Device::cpu()) : Tensor();
  const int64_t* c = device_counts.defined() ? device_counts.data<int64_t>() : nullptr;
  for (size_t g = 0; g < states_.size(); ++g)
    for (const ParamState& st : states_[g]) out[g].push_back(c ? *c++ : st.steps);
  return out;
}

}  // namespace trainer
