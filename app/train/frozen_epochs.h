#pragma once
// model.freeze_epochs in `trainer train`: each epoch starts with model.freeze's parameters frozen or not
// as the epoch says (app/run/freeze.h), so that a resumed run is frozen exactly as the uninterrupted one
// was. When that changes, what was laid out over the parameters that train is laid out again: the DDP
// reducer's buckets (rebuild_gradient_reducer) and the captured CUDA graph (dropped: the epoch's first
// full-size step runs eagerly, allocating the optimizer state of the parameters that now train, and
// the next is captured).
#include <cstdint>

namespace trainer {

struct TrainingRun;

// Before epoch `epoch` (0-based) runs its first step, with no gradient pending: freezes or unfreezes,
// and logs what changed.
void freeze_for_epoch(TrainingRun& run, int64_t epoch);

}  // namespace trainer
