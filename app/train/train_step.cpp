#include "app/train/train_step.h"

#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "app/common/format.h"
#include "app/train/host_readback.h"
#include "app/train/step_graph.h"
#include "app/train/training_run.h"

namespace trainer {

void check_loss_is_finite(double loss, int64_t step, int epoch, double lr) {
  if (std::isfinite(loss)) return;
  throw std::runtime_error(
      fmt("loss is %s at step %lld (epoch %d): training diverged. HINT: lower optim.lr "
          "(now %.4g), add warmup (schedule.warmup_epochs) or clipping "
          "(optim.clip_grad_norm); --resume auto restarts from the last checkpoint",
          std::isnan(loss) ? "NaN" : "infinite", static_cast<long long>(step), epoch + 1, lr));
}

namespace {

// data_wait and h2d: the next micro-batch on the device, in the model's input layout. False when the
// loader has run out.
bool fetch_micro_batch(TrainingRun& run, DevicePrefetcher& input, MicroBatch& mb) {
  StepTimer& timer = *run.reporter.timer;
  const StallHook& stall = run.context.faults.stall;
  if (!timer.in_step()) timer.begin_step();
  timer.begin(Phase::data_wait);
  if (run.context.rank() == stall.rank && run.state.step == stall.step)
    std::this_thread::sleep_for(std::chrono::duration<double>(stall.seconds));
  mb.batch = input.next();
  timer.end(Phase::data_wait);
  if (!mb.batch) return false;
  timer.begin(Phase::h2d);
  mb.on_device = input.to_device(*mb.batch);
  // no-ops on the GPU pipeline
  mb.images = mb.on_device.images.to(run.context.device).contiguous(run.context.precision.input_format);
  mb.labels = mb.on_device.labels.to(run.context.device);
  timer.end(Phase::h2d);
  return true;
}

// The micro-batch's random draws, staged on the device ahead of its forward, which reads them there
// (eagerly or replayed): Mixup/CutMix's, a function of the step alone (every rank stages the same), and
// stochastic depth's masks, the next of its generator's draws (nn/modules/stochastic_depth.h).
void stage_step_draws(TrainingRun& run, int micro, const Tensor& images) {
  if (run.step.mixer && run.step.soft_loss.mix_images)
    run.step.mixer->stage(run.state.step, micro, images.size(2), images.size(3));
  if (run.step.drop_path) run.step.drop_path->stage(images.size(0), run.context.device);
}

// What a step's micro-batch adds to the counters.
void count_micro_batch(TrainingRun& run, const MicroBatch& mb, StepResult& result) {
  run.state.samples_seen += mb.batch->labels.numel() * run.experiment.world_size;
  result.samples += mb.batch->labels.numel();
  ++run.state.batch_in_epoch;
}

// The schedule's learning rate for the step after state.step.
double step_lr(const Experiment& e, const TrainingState& state) {
  return e.base_lr * e.schedule->factor(state.step);
}

// The device loss scaler's outcome of the step just queued, read back while the next one runs.
void read_scaler_later(TrainingRun& run, StepResult& result) {
  result.pending_skipped_steps = run.step.readback->read_later(run.step.scaler->device_skipped());
  result.pending_loss_scale = run.step.readback->read_later(run.step.scaler->device_scale());
}

// TRAINER_TEST_INF_GRAD: one rank's gradient turns inf at one step, after the reduce, as a bad batch's
// would (every rank must then skip the step together). Empty at every other step.
std::function<void()> inf_grad_hook(TrainingRun& run) {
  const InfGradHook& hook = run.context.faults.inf_grad;
  if (run.context.rank() != hook.rank || run.state.step + 1 != hook.step || run.step.params.empty())
    return {};
  return [&params = run.step.params] {
    Variable first = params.front();  // a handle: its gradient is the parameter's
    if (first.grad().defined()) first.grad().fill_(std::numeric_limits<double>::infinity());
  };
}

// The step's losses: on the CPU read now (free); on a GPU read back while the next step runs (a read
// here would leave the device idle while the host queues the next step), so a non-finite loss stops the
// run one step later, when the step is reported.
void take_losses(TrainingRun& run, const std::vector<Tensor>& losses, StepResult& result) {
  const double accum = static_cast<double>(losses.size());
  if (!run.context.device.is_cuda()) {
    for (const Tensor& loss : losses) result.loss += loss.item() / accum;
    return;
  }
  std::vector<std::function<double()>> pending;
  for (const Tensor& loss : losses) pending.push_back(run.step.readback->read_later(loss));
  result.pending_loss = [pending = std::move(pending), accum] {
    double mean = 0.0;
    for (const auto& loss : pending) mean += loss() / accum;
    return mean;
  };
}

// The loss scaler's word on the step: a host scaler's skipped step is logged and counted now, a device
// scaler's outcome comes back with the loss.
void take_loss_scale(TrainingRun& run, const StepOutcome& outcome, StepResult& result) {
  Reporter& reporter = run.reporter;
  if (outcome.end == StepOutcome::End::skipped) {
    reporter.exporter->add_skipped_steps(1);
    reporter.log.line(fmt("step %lld: inf/NaN gradients at loss scale %g, step skipped",
                          static_cast<long long>(run.state.step + 1), outcome.loss_scale));
  }
  if (run.step.scaler->on_device())
    read_scaler_later(run, result);
  else
    reporter.exporter->set_loss_scale(run.step.scaler->scale());
}

// An eager step: micro-batches from the loader (the first already fetched), every phase timed.
std::optional<StepResult> eager_step(TrainingRun& run, DevicePrefetcher& input, int epoch, MicroBatch first) {
  StepResult result;
  MicroBatch current = std::move(first);
  const MicroBatchSource next = [&](int micro) -> std::optional<StepInput> {
    if (micro > 0) {
      current = MicroBatch{};  // its tensors go before the next micro-batch's are made
      if (!fetch_micro_batch(run, input, current)) return std::nullopt;
    }
    count_micro_batch(run, current, result);
    stage_step_draws(run, micro, current.images);
    return StepInput{current.images, current.labels};
  };
  result.lr = step_lr(run.experiment, run.state);
  const StepOutcome outcome =
      run_step(*run.step.parts, next, result.lr, &*run.reporter.timer, inf_grad_hook(run));
  if (outcome.end == StepOutcome::End::input_ran_out) return std::nullopt;
  if (outcome.end == StepOutcome::End::non_finite_loss)
    check_loss_is_finite(outcome.losses.back().item(), run.state.step + 1, epoch,
                         run.experiment.optimizer->lr());
  take_losses(run, outcome.losses, result);
  take_loss_scale(run, outcome, result);
  result.last = std::move(current);
  return result;
}

// Records the step as a CUDA graph and runs it: the graph's own input tensors, nothing timed (a CUDA
// event recorded in a capture cannot be timed), the learning rate already on the device.
void capture_step(TrainingRun& run, StepGraph& graph) {
  // Inside a replay the all-reduce is not timed apart from the step: the observer that opens
  // allreduce_total sits the capture out.
  PauseFirstLaunchObserver untimed(*run.data_parallel.reducer);
  const MicroBatchSource graph_inputs = [&graph](int) {
    return std::optional<StepInput>(StepInput{graph.images(), graph.labels()});
  };
  // Several ranks: the buckets' all-reduces and copies back are captured too.
  graph.capture_and_run(
      [&] { return run_step(*run.step.parts, graph_inputs, std::nullopt, nullptr).losses.back(); });
  run.reporter.log.line(fmt("CUDA graph: step %lld captured (%zu nodes%s); full-size batches replay it",
                            static_cast<long long>(run.state.step + 1), graph.nodes(),
                            run.data_parallel.reducer->active() ? ", with the gradient all-reduce" : ""));
}

// One step of one fetched batch as a CUDA graph: copy it into the graph's inputs, stage the
// optimizer's scalars, replay (capturing first, the first time). The loss comes back to the host while
// the next step runs: the result's pending_loss waits for it.
StepResult graphed_step(TrainingRun& run, MicroBatch mb) {
  Optimizer& optimizer = *run.experiment.optimizer;
  StepGraph& graph = *run.step.graph;
  StepResult result;
  run.reporter.timer->begin(Phase::graph);
  graph.load(mb.images, mb.labels);
  stage_step_draws(run, 0, mb.images);
  result.lr = step_lr(run.experiment, run.state);
  set_step_lr(optimizer, result.lr);  // the graph reads it from the device (use_device_scalars)
  ModelEma* ema = run.experiment.ema.get();
  if (ema) ema->stage_gate();  // ema.every_steps: whether this step updates the average, on the device
  if (graph.captured()) {
    graph.replay();
    optimizer.count_replayed_step();
    if (ema) ema->count_replayed_step();
  } else {
    capture_step(run, graph);
  }
  result.pending_loss = run.step.readback->read_later(graph.loss());
  if (run.step.scaler->on_device()) read_scaler_later(run, result);
  run.reporter.timer->end(Phase::graph);
  count_micro_batch(run, mb, result);
  result.last = std::move(mb);
  return result;
}

}  // namespace

std::optional<StepResult> train_step(TrainingRun& run, DevicePrefetcher& input, int epoch) {
  MicroBatch first;
  if (!fetch_micro_batch(run, input, first)) return std::nullopt;
  if (StepGraph* graph = run.step.graph.get()) {  // accum is 1 (step_graph_blocker)
    if (graph->accepts(first.images, first.labels)) return graphed_step(run, std::move(first));
    graph->note_eager_step(first.images, first.labels);
  }
  return eager_step(run, input, epoch, std::move(first));
}

}  // namespace trainer
