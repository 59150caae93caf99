#pragma once
// Layers without parameters or state: ReLU, GELU, Flatten, Permute, Identity.
#include <utility>
#include <vector>

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
  F::GeluApproximation approximate() const { return approximate_; }  // the form (ONNX export reads it)

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

// As torchvision.ops.Permute: a view with the dimensions reordered (no copy). ConvNeXt's [0, 2, 3, 1]
// turns a channels-last [N, C, H, W] map into a contiguous [N, H, W, C] one.
class Permute : public Module {
 public:
  explicit Permute(std::vector<int> order) : order_(std::move(order)) {}
  Variable forward(const Variable& x) override;

 private:
  std::vector<int> order_;
};

class Identity : public Module {
 public:
  Variable forward(const Variable& x) override { return x; }
};

}  // namespace trainer
