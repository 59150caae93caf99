#include "app/run/freeze.h"

#include <algorithm>

#include "app/common/format.h"

namespace trainer {
namespace {

constexpr const char* kBackbone = "backbone";

// `prefix` names `name` when it is the whole name or ends at one of its dots.
bool names_parameter(std::string prefix, const std::string& name) {
  if (prefix.ends_with('.')) prefix.pop_back();
  return name == prefix ||
         (name.starts_with(prefix) && name.size() > prefix.size() && name[prefix.size()] == '.');
}

// The first component of every parameter name, in registration order ("conv1, bn1, layer1, ..., fc").
std::string top_level_groups(const std::vector<NamedParameter>& params) {
  std::vector<std::string> groups;
  for (const NamedParameter& p : params) {
    const std::string group = p.name.substr(0, p.name.find('.'));
    if (std::find(groups.begin(), groups.end(), group) == groups.end()) groups.push_back(group);
  }
  std::string text;
  for (const std::string& g : groups) text += (text.empty() ? "" : ", ") + g;
  return text;
}

std::string quoted_list(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& n : names) text += (text.empty() ? "\"" : ", \"") + n + "\"";
  return "[" + text + "]";
}

}  // namespace

FrozenParameters::FrozenParameters(const Config& config, const Module& model, const std::string& head_prefix)
    : names_(config.model.freeze), epochs_(config.model.freeze_epochs) {
  const std::vector<NamedParameter> all = model.named_parameters();
  std::vector<bool> frozen(all.size(), false);
  for (const std::string& name : names_) {
    bool matched = false;
    for (size_t i = 0; i < all.size(); ++i) {
      const bool hit =
          name == kBackbone ? !all[i].name.starts_with(head_prefix) : names_parameter(name, all[i].name);
      matched = matched || hit;
      frozen[i] = frozen[i] || hit;
    }
    if (!matched)
      throw config_error_at(config, "model.freeze",
                            "\"" + name + "\" names no parameter of model '" + config.model.name +
                                "'. HINT: give prefixes of its parameter names ending at a dot; its "
                                "top-level groups are " +
                                top_level_groups(all) + " (or \"backbone\": all but " + head_prefix + ")");
  }
  for (size_t i = 0; i < all.size(); ++i) {
    if (frozen[i]) {
      params_.push_back(all[i]);
      elements_ += all[i].param.numel();
    } else {
      ++trained_tensors_;
      trained_elements_ += all[i].param.numel();
    }
  }
  if (any() && trained_tensors_ == 0)
    throw config_error_at(config, "model.freeze",
                          quoted_list(names_) +
                              " freezes every parameter: nothing would train. HINT: "
                              "\"backbone\" leaves the classifier head (" +
                              head_prefix + ") to train");
}

void FrozenParameters::set_frozen(bool frozen) const {
  for (const NamedParameter& p : params_) {
    Variable v = p.param;  // a handle: the model's parameter
    v.set_requires_grad(!frozen);
  }
}

std::string FrozenParameters::describe() const {
  const std::string until = epochs_ == 0   ? "for the whole run"
                            : epochs_ == 1 ? "for epoch 1"
                                           : fmt("for epochs 1-%d", epochs_);
  // The list may be long: joined, not formatted (fmt cuts at 511 characters).
  return fmt("freeze: %lld parameter tensors (%lld parameters) frozen by model.freeze = ",
             static_cast<long long>(tensors()), static_cast<long long>(elements_)) +
         quoted_list(names_) + " " + until +
         fmt("; %lld tensors (%lld parameters) train", static_cast<long long>(trained_tensors_),
             static_cast<long long>(trained_elements_));
}

std::string FrozenParameters::describe_end(int64_t epoch) const {
  return fmt(
      "freeze: ends at epoch %lld (model.freeze_epochs = %d): the %lld frozen tensors (%lld "
      "parameters) train from here, their optimizer state starting fresh",
      static_cast<long long>(epoch + 1), epochs_, static_cast<long long>(tensors()),
      static_cast<long long>(elements_));
}

}  // namespace trainer
