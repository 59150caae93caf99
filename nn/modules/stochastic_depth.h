#pragma once
// Stochastic depth as torchvision.ops.StochasticDepth(p, mode="row"): in training, drops a residual
// branch for each sample with probability p (the sample's branch output becomes 0) and scales the kept
// ones by 1/(1-p); identity in evaluation. It has no parameters, so a model's state dict is the same
// with it or without it. The masks come from a Generator shared with the owner, as Dropout's do.
#include <memory>

#include "nn/modules/module.h"
#include "nn/random.h"

namespace trainer {

class StochasticDepth : public Module {
 public:
  StochasticDepth(double p, std::shared_ptr<Generator> gen);
  Variable forward(const Variable& x) override;  // [N, ...] -> same
  double p() const { return p_; }
  // x + forward(branch) with a scale per channel applied to the branch first, in one op
  // (F::scaled_residual_add; ConvNeXt's block end): the same mask draws as forward.
  Variable add_scaled_branch(const Variable& x, const Variable& branch, const Variable& scale);

 private:
  double p_;
  std::shared_ptr<Generator> gen_;
};

}  // namespace trainer
