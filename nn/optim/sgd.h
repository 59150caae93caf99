#pragma once
// Stochastic gradient descent with torch.optim.SGD's semantics: coupled weight decay (added to the
// gradient), momentum with dampening (the buffer starts as the first gradient), optional Nesterov.
#include "nn/backend.h"
#include "nn/optim/optimizer.h"

namespace trainer {

struct SgdOptions {
  double lr = 0.1;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  bool no_decay_bn_bias = false;  // weight decay 0 for vectors, biases, position embeddings (timm)
  double layer_decay = 0.0;       // > 0: layer-wise LR decay (nn/optim/layer_decay.h)
};

// The kernel's parameters for one update (Sgd and ZeroOptimizer's shards alike).
SgdParams sgd_params(const SgdOptions& options, double lr, double weight_decay);

class Sgd final : public Optimizer {
 public:
  // Throws std::invalid_argument on invalid options (PyTorch's checks).
  Sgd(std::vector<NamedParameter> params, const SgdOptions& options);
  const SgdOptions& options() const { return options_; }
  // Dampening 0 (or no momentum): see Optimizer::skips_exactly_on_device.
  bool skips_exactly_on_device() const override {
    return options_.dampening == 0.0 || options_.momentum == 0.0;
  }

 protected:
  void update(Variable& param, const ParamGroup& group, ParamState& state) override;
  // The group's parameters in one backend call (one kernel launch on a GPU).
  void update_group(const ParamGroup& group, const std::vector<Update>& updates) override;

 private:
  SgdOptions options_;
};

}  // namespace trainer
