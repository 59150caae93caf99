#include "nn/optim/layer_decay.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <stdexcept>

namespace trainer {
namespace {

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// The number after `prefix` up to the next '.', or -1 when s does not start with prefix<digits>.
int number_after(const std::string& s, const std::string& prefix) {
  if (!starts_with(s, prefix)) return -1;
  size_t end = prefix.size();
  while (end < s.size() && std::isdigit(static_cast<unsigned char>(s[end]))) ++end;
  if (end == prefix.size() || (end < s.size() && s[end] != '.')) return -1;
  return std::stoi(s.substr(prefix.size(), end - prefix.size()));
}

bool any_starts_with(const std::vector<std::string>& names, const std::string& prefix) {
  return std::any_of(names.begin(), names.end(),
                     [&](const std::string& n) { return starts_with(n, prefix); });
}

// Ids from a per-name rule; -1 marks the head, which gets the largest id plus one.
template <class Rule>
std::vector<int> ids_with_head(const std::vector<std::string>& names, Rule rule, int min_head) {
  std::vector<int> ids;
  int last = min_head - 1;
  for (const std::string& n : names) {
    ids.push_back(rule(n));
    last = std::max(last, ids.back());
  }
  for (int& id : ids)
    if (id < 0) id = last + 1;
  return ids;
}

std::vector<int> vit_ids(const std::vector<std::string>& names) {
  return ids_with_head(
      names,
      [](const std::string& n) {
        if (n == "class_token" || starts_with(n, "conv_proj.") || n == "encoder.pos_embedding") return 0;
        const int layer = number_after(n, "encoder.layers.encoder_layer_");
        return layer >= 0 ? layer + 1 : -1;
      },
      1);
}

std::vector<int> resnet_ids(const std::vector<std::string>& names) {
  return ids_with_head(
      names,
      [](const std::string& n) {
        if (starts_with(n, "conv1.") || starts_with(n, "bn1.")) return 0;
        return number_after(n, "layer");
      },
      5);
}

std::vector<int> convnext_ids(const std::vector<std::string>& names) {
  return ids_with_head(
      names, [](const std::string& n) { return number_after(n, "features."); }, 1);
}

std::vector<int> top_level_ids(const std::vector<std::string>& names) {
  std::map<std::string, int> order;
  std::vector<int> ids;
  for (const std::string& n : names) {
    const std::string top = n.substr(0, n.find('.'));
    auto it = order.emplace(top, static_cast<int>(order.size())).first;
    ids.push_back(it->second);
  }
  return ids;
}

}  // namespace

std::vector<int> layer_ids(const std::vector<std::string>& names) {
  if (any_starts_with(names, "encoder.layers.encoder_layer_")) return vit_ids(names);
  if (any_starts_with(names, "layer1.") && any_starts_with(names, "fc.")) return resnet_ids(names);
  if (any_starts_with(names, "features.") && any_starts_with(names, "classifier."))
    return convnext_ids(names);
  return top_level_ids(names);
}

std::vector<ParamGroup> split_by_layer(std::vector<ParamGroup> groups, double layer_decay) {
  if (!(layer_decay > 0.0 && layer_decay <= 1.0))
    throw std::invalid_argument("layer_decay must be in (0, 1], got " + std::to_string(layer_decay));
  std::vector<std::string> names;
  for (const ParamGroup& g : groups)
    for (const NamedParameter& p : g.params) names.push_back(p.name);
  const std::vector<int> ids = layer_ids(names);
  const int last = ids.empty() ? 0 : *std::max_element(ids.begin(), ids.end());
  std::vector<ParamGroup> out;
  size_t flat = 0;
  std::vector<std::map<int, ParamGroup>> by_layer(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    for (NamedParameter& p : groups[g].params) {
      const int id = ids[flat++];
      ParamGroup& target = by_layer[g][id];
      if (target.params.empty()) {
        target.name = groups[g].name + "_layer_" + std::to_string(id);
        target.weight_decay = groups[g].weight_decay;
        target.lr_scale = groups[g].lr_scale * std::pow(layer_decay, last - id);
      }
      target.params.push_back(std::move(p));
    }
  }
  for (int id = 0; id <= last; ++id)
    for (auto& layers : by_layer)
      if (auto it = layers.find(id); it != layers.end()) out.push_back(std::move(it->second));
  return out;
}

}  // namespace trainer
