#include "nn/modules/module.h"

namespace trainer {

Variable& Module::register_parameter(std::string name, Tensor value) {
  params_.emplace_back(std::move(name), std::make_unique<Variable>(std::move(value), true));
  return *params_.back().second;
}

Tensor& Module::register_buffer(std::string name, Tensor value) {
  buffers_.emplace_back(std::move(name), std::make_unique<Tensor>(std::move(value)));
  return *buffers_.back().second;
}

std::vector<NamedParameter> Module::named_parameters(const std::string& prefix) const {
  std::vector<NamedParameter> out;
  for (const auto& [name, p] : params_) out.push_back({prefix + name, *p});
  for (const auto& [name, child] : children_) {
    auto sub = child->named_parameters(prefix + name + ".");
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

std::vector<NamedBuffer> Module::named_buffers(const std::string& prefix) {
  std::vector<NamedBuffer> out;
  for (auto& [name, b] : buffers_) out.push_back({prefix + name, b.get()});
  for (auto& [name, child] : children_) {
    auto sub = child->named_buffers(prefix + name + ".");
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

std::vector<NamedTensor> Module::state_dict(const std::string& prefix) {
  std::vector<NamedTensor> out;
  for (auto& [name, p] : params_) out.push_back({prefix + name, &p->data(), false});
  for (auto& [name, b] : buffers_) out.push_back({prefix + name, b.get(), true});
  for (auto& [name, child] : children_) {
    auto sub = child->state_dict(prefix + name + ".");
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules(const std::string& prefix) {
  std::vector<std::pair<std::string, Module*>> out;
  out.emplace_back(prefix.empty() ? prefix : prefix.substr(0, prefix.size() - 1), this);
  for (auto& [name, child] : children_) {
    auto sub = child->named_modules(prefix + name + ".");
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

std::vector<Variable> Module::parameters() const {
  std::vector<Variable> out;
  for (auto& np : named_parameters()) out.push_back(np.param);
  return out;
}

int64_t Module::parameter_count() const {
  int64_t n = 0;
  for (auto& np : named_parameters()) n += np.param.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  on_train_mode_change();
  for (auto& [name, child] : children_) child->train(on);
}

void Module::zero_grad() {
  for (auto& np : named_parameters()) np.param.zero_grad();
}

void Module::to(Device device) {
  for (auto& [name, p] : params_) p->data() = p->data().to(device);
  for (auto& [name, b] : buffers_) *b = b->to(device);
  for (auto& [name, child] : children_) child->to(device);
}

void Module::to(DType dtype) {
  for (auto& [name, p] : params_)
    if (is_floating(p->data().dtype())) p->data() = p->data().to(dtype);
  for (auto& [name, b] : buffers_)
    if (is_floating(b->dtype())) *b = b->to(dtype);
  for (auto& [name, child] : children_) child->to(dtype);
}

void Module::to(MemoryFormat format) {
  for (auto& [name, p] : params_)
    if (p->data().dim() == 4) p->data() = p->data().contiguous(format);
  for (auto& [name, b] : buffers_)
    if (b->dim() == 4) *b = b->contiguous(format);
  for (auto& [name, child] : children_) child->to(format);
}

}  // namespace trainer
