#pragma once
// LARS as timm's Lars (always_adapt off): where weight decay is not 0, the gradient becomes
// (g + weight_decay * w) * trust_coeff * |w| / (|g| + weight_decay * |w| + eps) (the ratio 1 where
// either norm is 0; with trust_clip, LARC, the ratio divided by the learning rate and at most 1), then
// SGD's momentum with dampening (the buffer starts as the first adapted gradient) and Nesterov.
#include "nn/backend.h"
#include "nn/optim/optimizer.h"

namespace trainer {

struct LarsOptions {
  double lr = 1.0;
  double momentum = 0.9;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  double trust_coeff = 1e-3;
  double eps = 1e-8;
  bool trust_clip = false;
  bool no_decay_bn_bias =
      false;                 // weight decay 0 (hence no adaptation) for vectors, biases, position embeddings
  double layer_decay = 0.0;  // > 0: layer-wise LR decay (nn/optim/layer_decay.h)
};

class Lars final : public Optimizer {
 public:
  // Throws std::invalid_argument on invalid options (timm's checks).
  Lars(std::vector<NamedParameter> params, const LarsOptions& options);
  const LarsOptions& options() const { return options_; }
  // As Sgd: exact with dampening 0 (see Optimizer::skips_exactly_on_device).
  bool skips_exactly_on_device() const override {
    return options_.dampening == 0.0 || options_.momentum == 0.0;
  }

 protected:
  void update(Variable& param, const ParamGroup& group, ParamState& state) override;

 private:
  LarsOptions options_;
};

}  // namespace trainer
