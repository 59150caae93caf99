#pragma once
// Layers without parameters or state: ReLU, GELU, Flatten, Identity.
#include "nn/functional.h"
#include "nn/modules/module.h"

namespace trainer {

class ReLU : public Module {
 public:
  Variable forward(const Variable& x) override;
};

// As torch.nn.GELU(approximate='none' or 'tanh').
class GELU : public Module {
 public:
  explicit GELU(F::GeluApproximation approximate = F::GeluApproximation::none) : approximate_(approximate) {}
  Variable forward(const Variable& x) override;

 private:
  F::GeluApproximation approximate_;
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
