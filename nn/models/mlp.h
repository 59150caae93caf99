#pragma once
// The baseline multi-layer perceptron: flatten -> fc1 (in*H*W -> 256) -> ReLU -> fc2 (256 -> 128)
// -> ReLU -> fc3 (128 -> classes).
#include <memory>

#include "nn/models/registry.h"
#include "nn/modules/layers.h"

namespace trainer {

class Mlp : public Module {
 public:
  Mlp(int64_t in_features, int64_t num_classes, Generator& gen);
  Variable forward(const Variable& x) override;  // [N, C, H, W] -> [N, classes]

 private:
  std::shared_ptr<Linear> fc1_, fc2_, fc3_;
};

std::shared_ptr<Module> make_mlp(const ModelOptions& options);

}  // namespace trainer
