#pragma once
// The scalar rules of the weight average and the layer-wise adaptive optimizers, once for the host
// (ModelEma, the CPU kernels) and the device (the CUDA kernels), so that the backends cannot drift
// apart: timm's ModelEmaV3 decay with its warm-up, and the trust ratios of timm's Lamb and Lars.
#include <cmath>
#include <cstdint>

#include "nn/backend.h"
#include "nn/elementwise_math.h"

namespace trainer {

// ModelEmaV3.get_decay(step) (update_after_step 0): the first update copies (decay 0); later ones use
// `decay`, or with the warm-up 1 - (1 + (step - 1) / gamma)^-power clamped to [min_decay, decay].
TRAINER_HOST_DEVICE double ema_decay(const EmaRule& rule, int64_t step) {
  const int64_t t = step - 1;
  if (t <= 0) return 0.0;
  if (!rule.warmup) return rule.decay;
  double d = 1.0 - pow(1.0 + static_cast<double>(t) / rule.warmup_gamma, -rule.warmup_power);
  d = d < rule.decay ? d : rule.decay;
  return d > rule.min_decay ? d : rule.min_decay;
}

// timm's _lamb_trust_ratio: |w| / |u|, 1 where either norm is 0 (or NaN: torch.where's comparisons are
// false), at most 1 with trust_clip (LAMBC).
TRAINER_HOST_DEVICE double lamb_trust_ratio(double w_norm, double u_norm, bool trust_clip) {
  double ratio = w_norm > 0 ? (u_norm > 0 ? w_norm / u_norm : 1.0) : 1.0;
  if (trust_clip && ratio > 1.0) ratio = 1.0;
  return ratio;
}

// timm's Lars: trust_coeff * |w| / (|g| + weight_decay * |w| + eps), 1 where either norm is 0; with
// trust_clip (LARC) divided by lr and at most 1.
TRAINER_HOST_DEVICE double lars_trust_ratio(double w_norm, double g_norm, const LarsParams& p, double lr) {
  double ratio =
      w_norm > 0 ? (g_norm > 0 ? p.trust_coeff * w_norm / (g_norm + w_norm * p.weight_decay + p.eps) : 1.0)
                 : 1.0;
  if (p.trust_clip) {
    ratio = ratio / lr;
    if (ratio > 1.0) ratio = 1.0;
  }
  return ratio;
}

// Lamb's clipping divisor: max(|g| / max_grad_norm, 1) from the squared global norm; 1 when off.
TRAINER_HOST_DEVICE double lamb_clip_divisor(double max_grad_norm, const double* grad_sq_norm) {
  if (!(max_grad_norm > 0) || !grad_sq_norm) return 1.0;
  const double ratio = sqrt(*grad_sq_norm) / max_grad_norm;
  return ratio > 1.0 ? ratio : (ratio != ratio ? ratio : 1.0);  // clamp_(min=1) keeps a NaN
}

}  // namespace trainer
