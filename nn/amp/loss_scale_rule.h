#pragma once
// torch.amp.GradScaler's update of the loss scale, once for every place that applies it: the host
// scaler (LossScaler::update, a double scale) and the device scaler's kernels on the CPU and the GPU
// (Backend::update_loss_scale, an f32 scale, as GradScaler's own tensor).
#include <cfloat>
#include <cstdint>

#include "nn/backend.h"
#include "nn/elementwise_math.h"

namespace trainer {

// growth_factor > 1, 0 < backoff_factor < 1, growth_interval >= 1.
inline bool valid_loss_scale_rule(const LossScaleRule& rule) {
  return rule.growth_factor > 1 && rule.backoff_factor > 0 && rule.backoff_factor < 1 &&
         rule.growth_interval >= 1;
}

// After a step: found_inf -> scale *= backoff_factor and the tracker restarts (the step was skipped:
// returns true); otherwise one more consecutive clean step, and at growth_interval of them
// scale *= growth_factor (only to a value finite in f32) and the tracker restarts. Products in double,
// rounded once to S.
template <class S>
TRAINER_HOST_DEVICE bool apply_loss_scale_rule(const LossScaleRule& rule, bool found_inf, S& scale,
                                               int64_t& tracker) {
  if (found_inf) {
    scale = static_cast<S>(static_cast<double>(scale) * rule.backoff_factor);
    tracker = 0;
    return true;
  }
  if (++tracker == rule.growth_interval) {
    const double grown = static_cast<double>(scale) * rule.growth_factor;
    if (static_cast<float>(grown) <= FLT_MAX) scale = static_cast<S>(grown);  // inf compares false
    tracker = 0;
  }
  return false;
}

}  // namespace trainer
