#include "app/train/divergence.h"

#include <algorithm>
#include <cmath>

#include "app/common/format.h"

namespace trainer {

bool accuracy_at_chance(double top1, int64_t classes, int64_t images) {
  // A diverged run's top-1 is a guesser's plus sampling noise on the test split; a margin that scaled
  // with 1 / classes (1.5x chance) called a 70% two-class model diverged.
  if (classes < 2) return false;
  const double p = 1.0 / static_cast<double>(classes);
  const double noise = 3.0 * std::sqrt(p * (1.0 - p) / static_cast<double>(std::max<int64_t>(images, 1)));
  return top1 < p + std::max(0.02, noise);
}

std::string divergence_hint(bool linear_scaling, int64_t global_batch, double lr) {
  const std::string given = linear_scaling ? fmt("linear scaling gave %.4g", lr) : fmt("optim.lr %.4g", lr);
  return fmt(
      "LR too high for the global batch of %lld (%s); lengthen the warm-up (schedule.warmup_epochs) "
      "or lower optim.lr",
      static_cast<long long>(global_batch), given.c_str());
}

std::string at_chance_warning(const Experiment& e, int64_t steps, double final_top1) {
  const int64_t classes = e.data.test ? e.data.test->num_classes() : 0;
  const int64_t images = e.data.test ? e.data.test->size() : 0;
  // Accuracy says little before about an epoch past the warm-up (a 3-step benchmark run is not diverged).
  if (final_top1 < 0 || steps < e.warmup_steps + e.steps_per_epoch ||
      !accuracy_at_chance(final_top1, classes, images))
    return "";
  return fmt("the final test top-1 %.2f%% %s (%lld classes) after %lld steps, past the %lld-step warm-up: "
             "training diverged or did not learn. HINT: ",
             100 * final_top1, kAtChanceMarker, static_cast<long long>(classes),
             static_cast<long long>(steps), static_cast<long long>(e.warmup_steps)) +
         divergence_hint(e.config.optim.lr_scaling == LrScaling::linear, global_batch(e.config, e.world_size),
                         e.base_lr);
}

}  // namespace trainer
