#include "app/train_step.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "app/format.h"
#include "app/host_readback.h"
#include "app/step_graph.h"
#include "nn/amp/autocast.h"
#include "nn/functional.h"

namespace trainer {

void check_loss_is_finite(double loss, int64_t step, int epoch, double lr) {
  if (std::isfinite(loss)) return;
  throw std::runtime_error(
      fmt("loss is %s at step %lld (epoch %d): training diverged. HINT: lower optim.lr "
          "(now %.4g), add warmup (schedule.warmup_epochs) or clipping "
          "(optim.clip_grad_norm); --resume auto restarts from the last checkpoint",
          std::isnan(loss) ? "NaN" : "infinite", static_cast<long long>(step), epoch + 1, lr));
}

StallHook stall_hook_from_env() {
  StallHook hook;
  if (const char* stall = std::getenv("TRAINER_TEST_STALL"))
    std::sscanf(stall, "%d:%lld:%lf", &hook.rank, &hook.step, &hook.seconds);
  return hook;
}

InfGradHook inf_grad_hook_from_env() {
  InfGradHook hook;
  if (const char* at = std::getenv("TRAINER_TEST_INF_GRAD"))
    std::sscanf(at, "%d:%lld", &hook.rank, &hook.step);
  return hook;
}

namespace {

// data_wait and h2d: the next micro-batch on the device, in the model's input layout. False when the
// loader has run out.
bool fetch_micro_batch(StepContext& ctx, DevicePrefetcher& input, const TrainingState& st, MicroBatch& mb) {
  StepTimer& timer = ctx.timer;
  if (!timer.in_step()) timer.begin_step();
  timer.begin(Phase::data_wait);
  if (ctx.rank == ctx.stall.rank && st.step == ctx.stall.step)
    std::this_thread::sleep_for(std::chrono::duration<double>(ctx.stall.seconds));
  mb.batch = input.next();
  timer.end(Phase::data_wait);
  if (!mb.batch) return false;
  timer.begin(Phase::h2d);
  mb.on_device = input.to_device(*mb.batch);
  mb.images = mb.on_device.images.to(ctx.device).contiguous(ctx.input_format);  // no-ops on the GPU pipeline
  mb.labels = mb.on_device.labels.to(ctx.device);
  timer.end(Phase::h2d);
  return true;
}

// The model's loss on one micro-batch (autocast for bf16/fp16: convolutions and matmuls in half, the
// loss in fp32).
Variable forward_loss(StepContext& ctx, const Tensor& images, const Tensor& labels) {
  AutocastScope autocast(ctx.half_dtype);
  return F::cross_entropy((*ctx.e.model)(Variable(images)), labels, ctx.config.train.label_smoothing);
}

// forward and backward of a fetched micro-batch, the `micro`-th of the step's ctx.accum. On the CPU
// the loss is checked before backward; on a GPU it is read back while the next step runs (a read
// here would leave the device idle while the host queues backward), so a non-finite loss stops the
// run one step later, when the step is reported.
void run_micro_batch(StepContext& ctx, MicroBatch& mb, int micro, TrainingState& st, int epoch,
                     StepResult& result, std::vector<std::function<double()>>& pending) {
  StepTimer& timer = ctx.timer;
  const int accum = ctx.accum;
  timer.begin(Phase::forward);
  mb.loss = forward_loss(ctx, mb.images, mb.labels);
  if (ctx.device.is_cuda()) {
    pending.push_back(ctx.readback.read_later(mb.loss.data()));
    timer.end(Phase::forward);
  } else {
    const double loss_value = mb.loss.item();
    timer.end(Phase::forward);
    check_loss_is_finite(loss_value, st.step + 1, epoch, ctx.e.optimizer->lr());
    result.loss += loss_value / accum;
  }
  // ---- backward (the loss of each micro-batch counts 1/k, so k micro-batches equal one big one)
  timer.begin(Phase::backward);
  const bool last_micro = micro + 1 == accum;
  ctx.reducer.set_sync(last_micro);  // accumulation micro-batches communicate nothing
  ctx.scaler.scale_loss(accum > 1 ? F::mul(mb.loss, 1.0 / accum) : mb.loss).backward();
  timer.end(Phase::backward);
}

// What a step's micro-batches add to the counters.
void count_micro_batch(StepContext& ctx, const MicroBatch& mb, TrainingState& st, StepResult& result) {
  st.samples_seen += mb.batch->labels.numel() * ctx.e.world_size;
  result.samples += mb.batch->labels.numel();
  ++st.batch_in_epoch;
}

// The schedule's learning rate for the step after st.step.
double step_lr(const Experiment& e, const TrainingState& st) {
  return e.base_lr * e.schedule->factor(st.step);
}

// The learning rate of the coming update, where the optimizer's kernels read it.
void set_step_lr(Optimizer& optimizer, double lr) {
  optimizer.set_lr(lr);
  if (optimizer.uses_device_scalars()) optimizer.stage_device_scalars();
}

// A loss scaler kept on the device: unscale, agree on the found-inf flag, step (the kernels skip on the
// flag), update the scale. Nothing waits for the device. Capturable (no read-back is queued here: a
// captured copy would keep writing into a slot the host reuses).
void step_with_device_scaler(StepContext& ctx) {
  LossScaler& scaler = ctx.scaler;
  scaler.unscale_on_device(ctx.params, ctx.agree_found_inf);
  ctx.e.optimizer->step();
  scaler.update_on_device();
}

// The device scaler's outcome of the step just queued, read back while the next one runs.
void read_scaler_later(StepContext& ctx, StepResult& result) {
  result.pending_skipped_steps = ctx.readback.read_later(ctx.scaler.device_skipped());
  result.pending_loss_scale = ctx.readback.read_later(ctx.scaler.device_scale());
}

// Without a scaler, or with one deciding on the host: unscale and check (one host read), then clip and
// step, or skip and say so.
void step_with_host_scaler(StepContext& ctx, const TrainingState& st, double lr) {
  LossScaler& scaler = ctx.scaler;
  const bool finite =
      !scaler.enabled() ||
      (ctx.zero ? scaler.unscale_and_check(ctx.zero->gradients_to_unscale(), ctx.all_ranks_finite)
                : scaler.unscale_and_check(ctx.params, ctx.all_ranks_finite));
  if (finite) {
    if (ctx.config.optim.clip_grad_norm > 0 && !ctx.zero)
      clip_grad_norm(ctx.params, ctx.config.optim.clip_grad_norm);
    set_step_lr(*ctx.e.optimizer, lr);
    ctx.e.optimizer->step();
  } else {
    ctx.exporter.add_skipped_steps(1);
    ctx.log.line(fmt("step %lld: inf/NaN gradients at loss scale %g, step skipped",
                     static_cast<long long>(st.step + 1), scaler.scale()));
  }
  scaler.update(!finite);
  ctx.exporter.set_loss_scale(scaler.scale());
}

// The step's end: wait for the all-reduce, then unscale and check (after the all-reduce, so every rank
// skips the same steps), clip, step, zero the gradients. Returns the step's learning rate.
double finish_step(StepContext& ctx, const TrainingState& st, StepResult& result) {
  StepTimer& timer = ctx.timer;
  timer.begin(Phase::allreduce_exposed);
  ctx.reducer.finish();
  timer.end(Phase::allreduce_exposed);
  if (ctx.allreduce_open) timer.end(Phase::allreduce_total);
  ctx.allreduce_open = false;
  if (ctx.rank == ctx.inf_grad.rank && st.step + 1 == ctx.inf_grad.step && !ctx.params.empty()) {
    Variable first = ctx.params.front();  // a handle: its gradient is the parameter's
    if (first.grad().defined()) first.grad().fill_(std::numeric_limits<double>::infinity());
  }
  timer.begin(Phase::optimizer);
  const double lr = step_lr(ctx.e, st);
  if (ctx.scaler.on_device()) {
    set_step_lr(*ctx.e.optimizer, lr);
    step_with_device_scaler(ctx);
    read_scaler_later(ctx, result);
  } else {
    step_with_host_scaler(ctx, st, lr);
  }
  ctx.e.optimizer->zero_grad();
  timer.end(Phase::optimizer);
  return lr;
}

// One step of one fetched batch as a CUDA graph: copy it into the graph's inputs, stage the
// optimizer's scalars, replay (capturing first, the first time). The loss comes back to the host while
// the next step runs: the result's pending_loss waits for it.
StepResult graphed_step(StepContext& ctx, MicroBatch mb, TrainingState& st) {
  Experiment& e = ctx.e;
  StepGraph& graph = *ctx.graph;
  StepResult result;
  ctx.timer.begin(Phase::graph);
  graph.load(mb.images, mb.labels);
  const double lr = step_lr(e, st);
  set_step_lr(*e.optimizer, lr);  // the graph reads it from the device (use_device_scalars)
  if (graph.captured()) {
    graph.replay();
    e.optimizer->count_replayed_step();
  } else {
    // Inside a replay the all-reduce is not timed apart from the step (and a CUDA event recorded in a
    // capture cannot be timed): the observer that opens allreduce_total sits the capture out.
    PauseFirstLaunchObserver untimed(ctx.reducer);
    graph.capture_and_run([&] {
      Variable loss = forward_loss(ctx, graph.images(), graph.labels());
      ctx.reducer.set_sync(true);
      ctx.scaler.scale_loss(loss).backward();  // the loss itself unless fp16
      ctx.reducer.finish();  // several ranks: the buckets' all-reduces and copies back, captured
      if (ctx.scaler.on_device()) {
        step_with_device_scaler(ctx);
      } else {
        e.optimizer->step();
      }
      e.optimizer->zero_grad();
      return loss.data();
    });
    ctx.log.line(fmt("CUDA graph: step %lld captured (%zu nodes%s); full-size batches replay it",
                     static_cast<long long>(st.step + 1), graph.nodes(),
                     ctx.reducer.active() ? ", with the gradient all-reduce" : ""));
  }
  result.pending_loss = ctx.readback.read_later(graph.loss());
  if (ctx.scaler.on_device()) read_scaler_later(ctx, result);
  ctx.timer.end(Phase::graph);
  result.lr = lr;
  count_micro_batch(ctx, mb, st, result);
  result.last = std::move(mb);
  return result;
}

}  // namespace

std::optional<StepResult> train_step(StepContext& ctx, DevicePrefetcher& input, TrainingState& st,
                                     int epoch) {
  StepResult result;
  std::vector<std::function<double()>> pending;  // the micro-batches' losses on their way to the host
  for (int micro = 0; micro < ctx.accum; ++micro) {
    MicroBatch mb;
    if (!fetch_micro_batch(ctx, input, st, mb)) return std::nullopt;
    if (ctx.graph) {  // accum is 1 (step_graph_blocker)
      if (ctx.graph->accepts(mb.images, mb.labels)) return graphed_step(ctx, std::move(mb), st);
      ctx.graph->note_eager_step(mb.images, mb.labels);
    }
    run_micro_batch(ctx, mb, micro, st, epoch, result, pending);
    count_micro_batch(ctx, mb, st, result);
    if (micro + 1 == ctx.accum) result.last = std::move(mb);
  }
  result.lr = finish_step(ctx, st, result);
  if (!pending.empty())
    result.pending_loss = [pending = std::move(pending), accum = ctx.accum] {
      double mean = 0.0;
      for (const auto& loss : pending) mean += loss() / accum;
      return mean;
    };
  return result;
}

}  // namespace trainer
