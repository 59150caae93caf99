#pragma once
// Adam with decoupled weight decay, torch.optim.AdamW's semantics (amsgrad off): the parameter
// shrinks by lr * weight_decay before the bias-corrected Adam update. The bias correction uses each
// parameter's own update count, as torch does (with a device loss scaler: the updates applied, see
// Optimizer::skip_if).
#include "nn/backend.h"
#include "nn/optim/optimizer.h"

namespace trainer {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  bool no_decay_bn_bias = false;  // weight decay 0 for vectors, biases, position embeddings (timm)
  double layer_decay = 0.0;       // > 0: layer-wise LR decay (nn/optim/layer_decay.h)
};

// The kernel's parameters for one update of a parameter on its `step`-th update (1-based), for AdamW
// and ZeroOptimizer's shards alike.
AdamWParams adamw_params(const AdamWOptions& options, double lr, double weight_decay, int64_t step);

class AdamW final : public Optimizer {
 public:
  // Throws std::invalid_argument on invalid options (PyTorch's checks).
  AdamW(std::vector<NamedParameter> params, const AdamWOptions& options);
  const AdamWOptions& options() const { return options_; }
  // Skips on a device flag exactly: the bias correction counts applied updates on the device
  // (Optimizer::skip_if), as torch.optim.AdamW counts the steps GradScaler did not skip.
  bool skips_exactly_on_device() const override { return true; }
  bool counts_updates_on_device() const override { return true; }

 protected:
  void update(Variable& param, const ParamGroup& group, ParamState& state) override;
  // The group's parameters in one Backend::adamw_step_many call (one launch per 36 tensors on a GPU).
  void update_group(const ParamGroup& group, const std::vector<Update>& updates) override;
  void device_scalar_values(const ParamGroup& group, int64_t step, double* out) const override;

 private:
  AdamWOptions options_;
};

}  // namespace trainer
