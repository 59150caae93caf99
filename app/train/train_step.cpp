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
  StepTimer& timer = *run.timer;
  const StallHook& stall = run.faults.stall;
  if (!timer.in_step()) timer.begin_step();
  timer.begin(Phase::data_wait);
  if (run.rank == stall.rank && run.st.step == stall.step)
    std::this_thread::sleep_for(std::chrono::duration<double>(stall.seconds));
  mb.batch = input.next();
  timer.end(Phase::data_wait);
  if (!mb.batch) return false;
  timer.begin(Phase::h2d);
  mb.on_device = input.to_device(*mb.batch);
  // no-ops on the GPU pipeline
  mb.images = mb.on_device.images.to(run.device).contiguous(run.precision.input_format);
  mb.labels = mb.on_device.labels.to(run.device);
  timer.end(Phase::h2d);
  return true;
}

// What a step's micro-batches add to the counters.
void count_micro_batch(TrainingRun& run, const MicroBatch& mb, StepResult& result) {
  run.st.samples_seen += mb.batch->labels.numel() * run.experiment.world_size;
  result.samples += mb.batch->labels.numel();
  ++run.st.batch_in_epoch;
}

// The schedule's learning rate for the step after st.step.
double step_lr(const Experiment& e, const TrainingState& st) {
  return e.base_lr * e.schedule->factor(st.step);
}

// The device loss scaler's outcome of the step just queued, read back while the next one runs.
void read_scaler_later(TrainingRun& run, StepResult& result) {
  result.pending_skipped_steps = run.readback->read_later(run.scaler->device_skipped());
  result.pending_loss_scale = run.readback->read_later(run.scaler->device_scale());
}

// An eager step: batches from the loader, every phase timed. On the CPU each loss is read and checked
// before backward; on a GPU it is read back while the next step runs (a read here would leave the
// device idle while the host queues backward), so a non-finite loss stops the run one step later, when
// the step is reported.
class EagerStep : public StepDriver {
 public:
  EagerStep(TrainingRun& run, DevicePrefetcher& input, int epoch, MicroBatch first)
      : run_(run), input_(input), epoch_(epoch), current_(std::move(first)) {}

  std::optional<StepInput> next(int micro) override {
    if (micro > 0 && !fetch_micro_batch(run_, input_, current_)) return std::nullopt;
    return StepInput{current_.images, current_.labels};
  }
  void begin(Phase phase) override { run_.timer->begin(phase); }
  void end(Phase phase) override { run_.timer->end(phase); }
  void forward_done(const Variable& loss, int) override {
    if (run_.device.is_cuda()) {
      pending_.push_back(run_.readback->read_later(loss.data()));
      end(Phase::forward);
      return;
    }
    const double loss_value = loss.item();
    end(Phase::forward);
    check_loss_is_finite(loss_value, run_.st.step + 1, epoch_, run_.experiment.optimizer->lr());
    result_.loss += loss_value / run_.parts->accum;
  }
  void micro_batch_done(Variable loss, int micro) override {
    current_.loss = std::move(loss);
    count_micro_batch(run_, current_, result_);
    if (micro + 1 == run_.parts->accum)
      result_.last = std::move(current_);
    else
      current_ = MicroBatch{};  // its tensors go before the next micro-batch's are made
  }
  void reduced() override {
    if (run_.allreduce.open) run_.timer->end(Phase::allreduce_total);
    run_.allreduce.open = false;
    const InfGradHook& inf_grad = run_.faults.inf_grad;
    if (run_.rank == inf_grad.rank && run_.st.step + 1 == inf_grad.step && !run_.params.empty()) {
      Variable first = run_.params.front();  // a handle: its gradient is the parameter's
      if (first.grad().defined()) first.grad().fill_(std::numeric_limits<double>::infinity());
    }
  }
  std::optional<double> learning_rate() override {
    result_.lr = step_lr(run_.experiment, run_.st);
    return result_.lr;
  }
  void skipped() override {
    run_.exporter->add_skipped_steps(1);
    run_.log.line(fmt("step %lld: inf/NaN gradients at loss scale %g, step skipped",
                      static_cast<long long>(run_.st.step + 1), run_.scaler->scale()));
  }
  void scaler_updated() override {
    if (run_.scaler->on_device())
      read_scaler_later(run_, result_);
    else
      run_.exporter->set_loss_scale(run_.scaler->scale());
  }

  // The step's result, once run_step() has returned true.
  StepResult result() && {
    if (!pending_.empty())
      result_.pending_loss = [pending = std::move(pending_), accum = run_.parts->accum] {
        double mean = 0.0;
        for (const auto& loss : pending) mean += loss() / accum;
        return mean;
      };
    return std::move(result_);
  }

 private:
  TrainingRun& run_;
  DevicePrefetcher& input_;
  int epoch_;
  MicroBatch current_;
  StepResult result_;
  std::vector<std::function<double()>> pending_;  // the micro-batches' losses on their way to the host
};

// The step being captured as a CUDA graph: the graph's own input tensors, nothing timed (a CUDA event
// recorded in a capture cannot be timed), the learning rate already on the device.
class CapturedStep : public StepDriver {
 public:
  explicit CapturedStep(const StepGraph& graph) : graph_(graph) {}
  std::optional<StepInput> next(int) override { return StepInput{graph_.images(), graph_.labels()}; }
  void micro_batch_done(Variable loss, int) override { loss_ = std::move(loss); }
  const Variable& loss() const { return loss_; }

 private:
  const StepGraph& graph_;
  Variable loss_;
};

// One step of one fetched batch as a CUDA graph: copy it into the graph's inputs, stage the
// optimizer's scalars, replay (capturing first, the first time). The loss comes back to the host while
// the next step runs: the result's pending_loss waits for it.
StepResult graphed_step(TrainingRun& run, MicroBatch mb) {
  Experiment& e = run.experiment;
  StepGraph& graph = *run.step_graph;
  StepResult result;
  run.timer->begin(Phase::graph);
  graph.load(mb.images, mb.labels);
  const double lr = step_lr(e, run.st);
  set_step_lr(*e.optimizer, lr);  // the graph reads it from the device (use_device_scalars)
  if (graph.captured()) {
    graph.replay();
    e.optimizer->count_replayed_step();
  } else {
    // Inside a replay the all-reduce is not timed apart from the step: the observer that opens
    // allreduce_total sits the capture out.
    PauseFirstLaunchObserver untimed(*run.reducer);
    graph.capture_and_run([&] {
      CapturedStep captured(graph);
      run_step(*run.parts, captured);  // several ranks: the buckets' all-reduces and copies back too
      return captured.loss().data();
    });
    run.log.line(fmt("CUDA graph: step %lld captured (%zu nodes%s); full-size batches replay it",
                     static_cast<long long>(run.st.step + 1), graph.nodes(),
                     run.reducer->active() ? ", with the gradient all-reduce" : ""));
  }
  result.pending_loss = run.readback->read_later(graph.loss());
  if (run.scaler->on_device()) read_scaler_later(run, result);
  run.timer->end(Phase::graph);
  result.lr = lr;
  count_micro_batch(run, mb, result);
  result.last = std::move(mb);
  return result;
}

}  // namespace

std::optional<StepResult> train_step(TrainingRun& run, DevicePrefetcher& input, int epoch) {
  MicroBatch first;
  if (!fetch_micro_batch(run, input, first)) return std::nullopt;
  if (StepGraph* graph = run.step_graph.get()) {  // accum is 1 (step_graph_blocker)
    if (graph->accepts(first.images, first.labels)) return graphed_step(run, std::move(first));
    graph->note_eager_step(first.images, first.labels);
  }
  EagerStep step(run, input, epoch, std::move(first));
  if (!run_step(*run.parts, step)) return std::nullopt;
  return std::move(step).result();
}

}  // namespace trainer
