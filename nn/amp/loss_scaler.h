#pragma once
// Dynamic loss scaling for fp16 training, with torch.cuda.amp.GradScaler's semantics:
//   backward on loss * scale; at the optimizer step (after the gradient all-reduce, so every rank sees
//   the same gradients) unscale the gradients and check them; any inf/NaN skips the step and halves the
//   scale; growth_interval clean steps in a row double it. The order follows flashlight's: scale,
//   backward, finish the all-reduce, unscale and check, clip, step.
// Gradient accumulation: every micro-batch's loss is scaled by the same factor; the gradients are
// unscaled once, at the optimizer step.
#include <cstdint>
#include <functional>
#include <vector>

#include "nn/autograd/variable.h"

namespace trainer {

struct LossScalerOptions {
  bool enabled = true;  // off: scale 1, never skips (fp32, tf32, bf16)
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions options = {});

  bool enabled() const { return options_.enabled; }
  double scale() const { return scale_; }
  int64_t growth_tracker() const { return growth_tracker_; }
  int64_t skipped_steps() const { return skipped_steps_; }

  // loss * scale (the loss itself when disabled).
  Variable scale_loss(const Variable& loss) const;

  // Multiplies every defined gradient by 1/scale and reports whether all are finite. `agree` combines
  // the local verdict across ranks (any rank's inf skips the step everywhere); identity by default.
  bool unscale_and_check(const std::vector<Variable>& params, const std::function<bool(bool)>& agree = {});
  // The same for gradient tensors held elsewhere (ZeRO stage 2's reduced shard).
  bool unscale_and_check(const std::vector<Tensor>& grads, const std::function<bool(bool)>& agree = {});

  // After the step decision: found_inf halves the scale and resets the tracker (the caller skipped the
  // optimizer step); otherwise counts a clean step and doubles the scale every growth_interval.
  void update(bool found_inf);

  // Checkpoint state.
  void load_state(double scale, int64_t growth_tracker);

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int64_t skipped_steps_ = 0;
};

}  // namespace trainer
