#pragma once
// Mixup and CutMix per batch with timm's semantics (timm.data.Mixup, mode "batch"): with probability
// `prob` a step mixes its batch with the batch reversed, by CutMix with probability `switch_prob` when
// both alphas are set (else the one that is), lambda ~ Beta(alpha, alpha). CutMix pastes a box of
// sqrt(1 - lambda) of each side, centred uniformly and clipped to the image, and corrects lambda to
// the box's true area (timm's correct_lam). The targets are smoothed one-hots mixed by lambda.
// Where we differ: timm refuses an odd batch; here its middle sample is its own partner and stays as it
// is (an epoch's last batch may be odd). timm's cutmix_minmax, per-sample ("elem", "pair") modes and
// BCE's target_threshold are not offered.
//
// The draws of a step are a function of (seed, step, micro-batch) only: every rank draws the same, a
// resumed run draws what the uninterrupted one did, and nothing depends on the order of other random
// calls. They are made on the host and staged in a small device tensor (BatchMixer) that the kernels
// read (nn/batch_mix_math.h), so a captured CUDA-graph step mixes every replay with fresh draws.
#include <cstdint>

#include "nn/random.h"
#include "nn/tensor.h"

namespace trainer {

struct MixSettings {
  double mixup_alpha = 0.0;   // 0: no Mixup
  double cutmix_alpha = 0.0;  // 0: no CutMix
  double prob = 1.0;          // of mixing a batch at all
  double switch_prob = 0.5;   // of CutMix rather than Mixup when both alphas are set
  bool enabled() const { return prob > 0.0 && (mixup_alpha > 0.0 || cutmix_alpha > 0.0); }
};

// One step's draws. lambda = 1 leaves the batch and its targets as they are.
struct MixDraw {
  bool cutmix = false;
  double lambda = 1.0;                     // for CutMix, 1 - the box's area / the image's
  int64_t y0 = 0, y1 = 0, x0 = 0, x1 = 0;  // CutMix's box: rows [y0, y1), columns [x0, x1)
};

// A sample of Beta(alpha, alpha) (alpha > 0) from two Gamma(alpha) samples (Marsaglia and Tsang's
// method, in logarithms so that small alphas do not underflow).
double sample_beta(Generator& gen, double alpha);

// The generator of a step's draws: seeded from (seed, step, micro-batch) alone.
Generator mix_generator(uint64_t seed, int64_t step, int micro);

// The draws for a batch of height x width images, in timm's order of random calls.
MixDraw draw_mix(const MixSettings& settings, Generator& gen, int64_t height, int64_t width);
MixDraw draw_mix(const MixSettings& settings, uint64_t seed, int64_t step, int micro, int64_t height,
                 int64_t width);

// The draws as the kernels read them: f64 [kMixDrawValues] on the host (nn/batch_mix_math.h).
Tensor mix_draw_values(const MixDraw& draw);

// The device tensor the step's kernels read the draws from, at one address for the run (a CUDA graph
// captures it), refilled before each micro-batch. Until stage() it holds lambda = 1 (no mixing), which
// is also what a run with soft targets but no mixing (loss "bce") keeps.
class BatchMixer {
 public:
  BatchMixer(const MixSettings& settings, uint64_t seed, Device device);
  const MixSettings& settings() const { return settings_; }
  // Draws for (step, micro) and queues their copy to the device, ahead of the step that reads them.
  const MixDraw& stage(int64_t step, int micro, int64_t height, int64_t width);
  const Tensor& draws() const { return draws_; }
  const MixDraw& last() const { return last_; }

 private:
  MixSettings settings_;
  uint64_t seed_;
  Tensor draws_;
  MixDraw last_;
};

}  // namespace trainer
