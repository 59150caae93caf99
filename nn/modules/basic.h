#pragma once
// Layers without parameters or state: ReLU, Flatten, Identity.
#include "nn/modules/module.h"

namespace trainer {

class ReLU : public Module {
 public:
  Variable forward(const Variable& x) override;
};

// [N, d1, d2, ...] -> [N, d1 * d2 * ...] for start_dim 1, as torch.nn.Flatten.
class Flatten : public Module {
 public:
  explicit Flatten(int start_dim = 1) : start_dim_(start_dim) {}
  Variable forward(const Variable& x) override;

 private:
  int start_dim_;
};

class Identity : public Module {
 public:
  Variable forward(const Variable& x) override { return x; }
};

}  // namespace trainer
