#pragma once
// Naming a run that diverged -- its loss became NaN or infinite, or its test top-1 is still at chance
// after the warm-up -- with what to change. `trainer train` warns; `trainer bench --to-accuracy` reads
// the markers below in a run's output to report the point as diverged instead of just "not reached".
#include <cstdint>
#include <string>

#include "app/run/experiment.h"

namespace trainer {

// In the message of a run stopped by a non-finite loss or non-finite outputs (train_step, evaluate).
inline constexpr const char* kDivergedMarker = "training diverged";
// In the warning of a run that ended at chance accuracy (at_chance_warning).
inline constexpr const char* kAtChanceMarker = "is at chance";

// Top-1 no better than guessing among `classes` on `images` test images: within three standard
// deviations of a guesser's accuracy p = 1 / classes (sqrt(p (1 - p) / images)), and at least 2
// points above it (10 classes, 10,000 images: < 12%; 2 classes: < 52%).
bool accuracy_at_chance(double top1, int64_t classes, int64_t images);

// "LR too high for the global batch (linear scaling gave 0.4); lengthen the warm-up
// (schedule.warmup_epochs) or lower optim.lr". Without linear scaling it names the LR as given.
std::string divergence_hint(bool linear_scaling, int64_t global_batch, double lr);

// The warning for a run whose final test top-1 is at chance after `steps` optimizer steps, at least an
// epoch past the warm-up; "" when it is not, the run is shorter or final_top1 < 0 (no evaluation).
std::string at_chance_warning(const Experiment& e, int64_t steps, double final_top1);

}  // namespace trainer
