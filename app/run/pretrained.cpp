#include "app/run/pretrained.h"

#include <map>
#include <optional>
#include <set>
#include <stdexcept>

#include "nn/safetensors.h"

namespace trainer {
namespace {

bool is_step_counter(const std::string& name) {
  return name == "num_batches_tracked" || name.ends_with(".num_batches_tracked");
}

[[noreturn]] void refuse(const std::string& path, const std::string& name, const std::string& why) {
  throw std::runtime_error(path + ": tensor '" + name + "' " + why +
                           ". HINT: model.pretrained must hold weights of this architecture (model.name), "
                           "with torchvision's names");
}

// The file's tensor for the model's `slot`, converted where the rules allow; nullopt: keep the model's.
std::optional<Tensor> fitted(const std::string& path, const NamedTensor& slot, const Tensor& stored,
                             Module& model, const std::string& head_prefix, PretrainedLoad& load) {
  const Tensor& mine = *slot.tensor;
  Tensor t = stored;
  if (t.dtype() != mine.dtype()) {
    if (!is_floating(t.dtype()) || !is_floating(mine.dtype()))
      refuse(path, slot.name,
             "is " + safetensors_dtype_name(t.dtype()) + " in the file, " +
                 safetensors_dtype_name(mine.dtype()) + " in the model");
    t = t.to(mine.dtype());
  }
  if (t.shape() == mine.shape()) return t;
  if (slot.name.starts_with(head_prefix)) {
    load.kept_fresh.push_back(slot.name + " " + shape_str(t.shape()) + " -> " + shape_str(mine.shape()));
    return std::nullopt;
  }
  std::optional<Tensor> converted = model.adapt_loaded_tensor(slot.name, t);
  if (!converted || converted->shape() != mine.shape())
    refuse(
        path, slot.name,
        "has shape " + shape_str(t.shape()) + " in the file, " + shape_str(mine.shape()) + " in the model");
  load.resized.push_back(slot.name + " " + shape_str(t.shape()) + " -> " + shape_str(mine.shape()));
  return converted->to(mine.dtype());
}

}  // namespace

std::string PretrainedLoad::summary(const std::string& path) const {
  std::string s = "pretrained weights " + path + ": " + std::to_string(copied) + " tensors loaded";
  if (!kept_fresh.empty())
    s += "; classifier re-initialised for this run's classes (" + std::to_string(kept_fresh.size()) +
         " tensors, e.g. " + kept_fresh.front() + ")";
  for (const std::string& r : resized) s += "; resized " + r;
  if (!zeroed.empty()) s += "; " + std::to_string(zeroed.size()) + " BatchNorm step counters set to 0";
  return s;
}

PretrainedLoad load_pretrained(const std::string& path, Module& model, const std::string& head_prefix) {
  const std::map<std::string, Tensor> file = load_safetensors(path);
  PretrainedLoad load;
  std::map<std::string, Tensor> chosen;  // the model's name -> what it receives
  std::set<std::string> names;
  for (const NamedTensor& slot : model.state_dict()) {
    names.insert(slot.name);
    const auto it = file.find(slot.name);
    if (it == file.end()) {
      if (!is_step_counter(slot.name)) refuse(path, slot.name, "is missing from the file");
      load.zeroed.push_back(slot.name);
      continue;
    }
    if (std::optional<Tensor> t = fitted(path, slot, it->second, model, head_prefix, load))
      chosen.emplace(slot.name, std::move(*t));
  }
  for (const auto& [name, t] : file)
    if (!names.count(name)) refuse(path, name, "is in the file but not in the model");
  for (const NamedTensor& slot : model.state_dict()) {
    if (const auto it = chosen.find(slot.name); it != chosen.end()) {
      slot.tensor->copy_(it->second);
      ++load.copied;
    } else if (is_step_counter(slot.name) && !file.count(slot.name)) {
      slot.tensor->fill_(0.0);
    }
  }
  return load;
}

}  // namespace trainer
