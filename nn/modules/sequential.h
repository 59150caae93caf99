#pragma once
// Applies its children in order; children are named "0", "1", ... as in torch.nn.Sequential, so a
// Sequential's parameters appear as "<index>.<name>" in the state dict.
#include <cstddef>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>

#include "nn/modules/module.h"

namespace trainer {

class Sequential : public Module {
 public:
  Sequential() = default;
  Sequential(std::initializer_list<std::shared_ptr<Module>> modules);
  // Appends a module under the next index and returns it.
  template <class M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> module) {
    return register_module(std::to_string(children().size()), std::move(module));
  }
  Variable forward(const Variable& x) override;

  size_t size() const { return children().size(); }
  bool empty() const { return children().empty(); }
  Module& operator[](size_t i) const { return *children().at(i).second; }
};

// Applies its children in order under names of the owner's choosing, as an nn.Sequential built from
// an OrderedDict (torchvision's ViT: encoder.layers.encoder_layer_0, heads.head).
class NamedSequential : public Module {
 public:
  template <class M>
  std::shared_ptr<M> add(std::string name, std::shared_ptr<M> module) {
    return register_module(std::move(name), std::move(module));
  }
  Variable forward(const Variable& x) override;
};

}  // namespace trainer
