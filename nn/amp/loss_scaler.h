#pragma once
// Dynamic loss scaling for fp16 training, with torch.cuda.amp.GradScaler's semantics:
//   backward on loss * scale; at the optimizer step (after the gradient all-reduce, so every rank sees
//   the same gradients) unscale the gradients and check them; any inf/NaN skips the step and halves the
//   scale; growth_interval clean steps in a row double it. The order follows flashlight's: scale,
//   backward, finish the all-reduce, unscale and check, clip, step.
// Gradient accumulation: every micro-batch's loss is scaled by the same factor; the gradients are
// unscaled once, at the optimizer step.
//
// Kept on the device (keep_on_device), the scaler decides there instead, so that no step waits for
// the host: the scale, growth tracker, skipped-step count and found-inf flag live in device tensors;
// unscale_on_device() flags, the optimizer's kernels skip on the flag (Optimizer::skip_if), and
// update_on_device() applies GradScaler's rule. A step is then capturable in a CUDA graph, and the host
// learns about skipped steps from device_skipped() when it reads it back (one step later in the trainer).
#include <cstdint>
#include <functional>
#include <vector>

#include "nn/autograd/variable.h"
#include "nn/backend.h"

namespace trainer {

struct LossScalerOptions {
  bool enabled = true;  // off: scale 1, never skips (fp32, tf32, bf16)
  double init_scale = 65536.0;
  LossScaleRule rule;  // growth 2x every 2000 clean steps, back-off 0.5x (GradScaler's defaults)
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions options = {});

  bool enabled() const { return options_.enabled; }
  double scale() const;
  int64_t growth_tracker() const;
  int64_t skipped_steps() const;

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

  // Checkpoint state (on the device too once kept there).
  void load_state(double scale, int64_t growth_tracker);

  // ---- kept on the device. From now on scale(), growth_tracker() and skipped_steps() read the device
  // (a host synchronisation: for checkpoints and summaries, not every step); update() and
  // unscale_and_check() are not used.
  void keep_on_device(Device device);
  bool on_device() const { return device_scale_.defined(); }
  // Every defined gradient times 1/scale, setting the found-inf flag on a non-finite value; then
  // `agree` (an all-reduce max of the flag over ranks, at several ranks) so all ranks skip together.
  void unscale_on_device(const std::vector<Variable>& params, const std::function<void(Tensor&)>& agree = {});
  // The found-inf flag for the optimizer's kernels (valid between unscale_on_device and update_on_device).
  const int64_t* found_inf_flag() const;
  // Skips or grows as update() does, on the device, and clears the flag.
  void update_on_device();
  // f32 [1] and f64 [1] device tensors, for reading back without waiting.
  const Tensor& device_scale() const { return device_scale_; }
  const Tensor& device_skipped() const { return device_skipped_; }

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int64_t skipped_steps_ = 0;
  Tensor device_scale_;    // f32 [1]
  Tensor device_tracker_;  // i64 [1]
  Tensor device_skipped_;  // f64 [1]
  Tensor found_inf_;       // i64 [1]
};

}  // namespace trainer
