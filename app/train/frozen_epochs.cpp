#include "app/train/frozen_epochs.h"

#include <memory>

#include "app/common/format.h"
#include "app/train/training_run.h"

namespace trainer {

void freeze_for_epoch(TrainingRun& run, int64_t epoch) {
  const FrozenParameters& frozen = run.experiment.frozen;
  if (!frozen.any()) return;
  const bool now = frozen.frozen_in(epoch);
  const bool first = !run.loop.frozen.has_value();
  if (!first && *run.loop.frozen == now) return;
  if (first && !now) {  // a run resumed after the freeze: it never freezes
    run.reporter.log.line(
        fmt("freeze: model.freeze_epochs = %d ended before epoch %lld, where this run "
            "resumes: every parameter trains",
            run.experiment.config.model.freeze_epochs, static_cast<long long>(epoch + 1)));
    run.loop.frozen = false;
    return;
  }
  frozen.set_frozen(now);
  run.loop.frozen = now;
  run.reporter.log.line(now ? frozen.describe() : frozen.describe_end(epoch));
  if (run.step.graph) {
    // The graph goes before the reducer whose bucket copies and collectives it recorded.
    const bool was_captured = run.step.graph->captured();
    run.step.graph.reset();
    run.step.graph = std::make_unique<StepGraph>(&run.processes.group->comm());
    if (was_captured)
      run.reporter.log.line(
          "CUDA graph: dropped with the old set of trained parameters; the next full-size "
          "step runs eagerly, the one after is captured again");
  }
  rebuild_gradient_reducer(run);
}

}  // namespace trainer
