#include "nn/optim/ema.h"

#include <cmath>
#include <map>
#include <stdexcept>

#include "nn/optim/optimizer.h"

namespace trainer {
namespace {

const EmaOptions& validated(const EmaOptions& o) {
  auto check = [](bool ok, const std::string& what, double value) { require_option("ema", ok, what, value); };
  check(o.decay >= 0.0 && o.decay < 1.0, "decay (must be in [0, 1))", o.decay);
  check(o.min_decay >= 0.0 && o.min_decay <= o.decay, "min_decay (must be in [0, decay])", o.min_decay);
  check(std::isfinite(o.warmup_gamma) && o.warmup_gamma > 0.0, "warmup_gamma (must be > 0)", o.warmup_gamma);
  check(std::isfinite(o.warmup_power) && o.warmup_power > 0.0, "warmup_power (must be > 0)", o.warmup_power);
  check(o.every_steps >= 1, "every_steps (must be >= 1)", static_cast<double>(o.every_steps));
  return o;
}

Tensor clone_of(const Tensor& t) { return t.clone(t.suggest_memory_format()); }

EmaRule rule_of(const EmaOptions& o) {
  EmaRule r;
  r.decay = o.decay;
  r.min_decay = o.min_decay;
  r.warmup = o.warmup;
  r.warmup_gamma = o.warmup_gamma;
  r.warmup_power = o.warmup_power;
  r.every_steps = o.every_steps;
  return r;
}

}  // namespace

ModelEma::ModelEma(Module& model, const EmaOptions& options)
    : options_(validated(options)), model_state_(model.state_dict()) {
  if (model_state_.empty()) throw std::invalid_argument("ema: the model has no state to average");
  Device device = model_state_.front().tensor->device();
  for (const NamedTensor& entry : model_state_) {
    if (entry.tensor->device() != device)
      throw std::invalid_argument("ema: '" + entry.name + "' is on " + entry.tensor->device().str() +
                                  ", not " + device.str() + " as the rest of the model");
    averages_.push_back(clone_of(*entry.tensor));
  }
  updates_ = Tensor::zeros({1}, DType::i64, device);
}

void ModelEma::after_optimizer_step(bool skipped, const int64_t* skip_if) {
  ++steps_;
  const bool staged = gate_staged_;
  gate_staged_ = false;
  if (skipped) return;
  if (!staged && steps_ % options_.every_steps != 0) return;  // the host decides: not this step
  std::vector<Backend::EmaPair> pairs;
  pairs.reserve(averages_.size());
  for (size_t i = 0; i < averages_.size(); ++i)
    pairs.push_back(
        {&averages_[i], model_state_[i].tensor, model_state_[i].is_buffer && !options_.average_buffers});
  EmaParams p;
  p.rule = rule_of(options_);
  p.skip_if = skip_if;
  p.gate = staged ? static_cast<const int64_t*>(gate_.raw_data()) : nullptr;
  backend_for(updates_).ema_update(pairs, updates_, p);
}

void ModelEma::stage_gate() {
  if (options_.every_steps == 1) return;  // every step updates: no verdict to stage
  if (!gate_.defined()) {
    gate_ = Tensor::zeros({1}, DType::i64, updates_.device());
    host_gate_ = Tensor::zeros({1}, DType::i64);
  }
  *host_gate_.data<int64_t>() = (steps_ + 1) % options_.every_steps == 0 ? 1 : 0;
  gate_.copy_(host_gate_);  // pageable: staged before copy_ returns, as Optimizer::stage_device_scalars
  gate_staged_ = true;
}

int64_t ModelEma::bytes() const {
  int64_t total = 0;
  for (const Tensor& average : averages_) total += static_cast<int64_t>(average.nbytes());
  return total;
}

int64_t ModelEma::updates() const { return static_cast<int64_t>(updates_.to(Device::cpu()).item()); }

std::vector<std::pair<std::string, Tensor>> ModelEma::state_tensors() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < averages_.size(); ++i)
    out.emplace_back(model_state_[i].name, clone_of(averages_[i]));
  return out;
}

void ModelEma::load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps,
                          int64_t updates) {
  if (steps < 0 || updates < 0 || updates > steps)
    throw std::invalid_argument("ema state: invalid counts (steps " + std::to_string(steps) + ", updates " +
                                std::to_string(updates) + ")");
  std::map<std::string, const Tensor*> given;
  for (const auto& [name, tensor] : state)
    if (!given.emplace(name, &tensor).second)
      throw std::invalid_argument("ema state: duplicate entry '" + name + "'");
  std::vector<const Tensor*> ordered;
  for (size_t i = 0; i < averages_.size(); ++i) {
    auto it = given.find(model_state_[i].name);
    if (it == given.end())
      throw std::invalid_argument("ema state: missing entry '" + model_state_[i].name + "'");
    if (it->second->shape() != averages_[i].shape())
      throw std::invalid_argument("ema state: entry '" + it->first + "' has shape " +
                                  shape_str(it->second->shape()) + ", the model has " +
                                  shape_str(averages_[i].shape()));
    ordered.push_back(it->second);
    given.erase(it);
  }
  if (!given.empty())
    throw std::invalid_argument("ema state: unexpected entry '" + given.begin()->first + "'");
  for (size_t i = 0; i < averages_.size(); ++i) averages_[i].copy_(*ordered[i]);
  updates_.copy_(Tensor::scalar(static_cast<double>(updates), DType::i64).reshape({1}));
  steps_ = steps;
}

void ModelEma::restart_from_model(int64_t steps) {
  for (size_t i = 0; i < averages_.size(); ++i) averages_[i].copy_(*model_state_[i].tensor);
  updates_.fill_(0.0);
  steps_ = steps;
}

void ModelEma::copy_from_model() {
  for (size_t i = 0; i < averages_.size(); ++i) averages_[i].copy_(*model_state_[i].tensor);
}

void ModelEma::copy_to_model() const {
  for (size_t i = 0; i < averages_.size(); ++i) model_state_[i].tensor->copy_(averages_[i]);
}

EmaWeightsScope::EmaWeightsScope(Module& model, const ModelEma& ema) : state_(model.state_dict()) {
  for (const NamedTensor& entry : state_) saved_.push_back(clone_of(*entry.tensor));
  ema.copy_to_model();
}

EmaWeightsScope::~EmaWeightsScope() {
  for (size_t i = 0; i < state_.size(); ++i) state_[i].tensor->copy_(saved_[i]);
}

}  // namespace trainer
