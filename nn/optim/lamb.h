#pragma once
// LAMB as timm's Lamb (the NVLAMB variant of apex's FusedLAMB) with always_adapt off: Adam's moments
// with grad averaging and bias correction, coupled weight decay added to the update direction, the
// update scaled by the layer's trust ratio |w| / |u| (1 where either is 0; at most 1 with trust_clip,
// LAMBC) only where weight decay is not 0, and every gradient first divided by
// max(|g| / max_grad_norm, 1) for the global norm |g| of all gradients of the step (timm's own
// clipping; max_grad_norm 0 turns it off). Differences: the bias correction counts each parameter's
// own updates (timm counts per group: the same while every parameter of a group gets a gradient).
#include "nn/backend.h"
#include "nn/optim/optimizer.h"

namespace trainer {

struct LambOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-6;
  double weight_decay = 0.01;
  double max_grad_norm = 1.0;  // 0: no clipping
  bool trust_clip = false;
  bool no_decay_bn_bias =
      false;                 // weight decay 0 (hence no adaptation) for vectors, biases, position embeddings
  double layer_decay = 0.0;  // > 0: layer-wise LR decay (nn/optim/layer_decay.h)
};

class Lamb final : public Optimizer {
 public:
  // Throws std::invalid_argument on invalid options.
  Lamb(std::vector<NamedParameter> params, const LambOptions& options);
  const LambOptions& options() const { return options_; }
  // The global norm on the device, then the per-parameter updates.
  void step() override;
  // As AdamW: the bias correction counts applied updates on the device (Optimizer::skip_if).
  bool skips_exactly_on_device() const override { return true; }
  bool counts_updates_on_device() const override { return true; }

 protected:
  void update(Variable& param, const ParamGroup& group, ParamState& state) override;
  void device_scalar_values(const ParamGroup& group, int64_t step, double* out) const override;

 private:
  LambOptions options_;
  Tensor grad_sq_norm_;  // f64 [1] on the parameters' device: this step's squared global gradient norm
};

}  // namespace trainer
