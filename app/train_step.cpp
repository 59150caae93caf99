#include "app/train_step.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

#include "app/format.h"
#include "nn/amp/autocast.h"
#include "nn/functional.h"

namespace trainer {

StallHook stall_hook_from_env() {
  StallHook hook;
  if (const char* stall = std::getenv("TRAINER_TEST_STALL"))
    std::sscanf(stall, "%d:%lld:%lf", &hook.rank, &hook.step, &hook.seconds);
  return hook;
}

std::optional<StepResult> train_step(StepContext& ctx, DevicePrefetcher& input, TrainingState& st,
                                     int epoch) {
  Experiment& e = ctx.e;
  StepTimer& timer = ctx.timer;
  LossScaler& scaler = ctx.scaler;
  const int accum = ctx.accum;
  StepResult result;
  for (int micro = 0; micro < accum; ++micro) {
    MicroBatch mb;
    if (!timer.in_step()) timer.begin_step();
    // ---- data
    timer.begin(Phase::data_wait);
    if (ctx.rank == ctx.stall.rank && st.step == ctx.stall.step)
      std::this_thread::sleep_for(std::chrono::duration<double>(ctx.stall.seconds));
    mb.batch = input.next();
    timer.end(Phase::data_wait);
    if (!mb.batch) return std::nullopt;
    timer.begin(Phase::h2d);
    mb.on_device = input.to_device(*mb.batch);
    mb.images =
        mb.on_device.images.to(ctx.device).contiguous(ctx.input_format);  // no-ops on the GPU pipeline
    mb.labels = mb.on_device.labels.to(ctx.device);
    timer.end(Phase::h2d);
    // ---- forward (autocast for bf16/fp16: convolutions and matmuls in half, loss in fp32)
    timer.begin(Phase::forward);
    {
      AutocastScope autocast(ctx.half_dtype);
      mb.loss =
          F::cross_entropy((*e.model)(Variable(mb.images)), mb.labels, ctx.config.train.label_smoothing);
    }
    const double loss_value = mb.loss.item();
    timer.end(Phase::forward);
    if (!std::isfinite(loss_value))
      throw std::runtime_error(
          fmt("loss is %s at step %lld (epoch %d): training diverged. HINT: lower optim.lr "
              "(now %.4g), add warmup (schedule.warmup_epochs) or clipping "
              "(optim.clip_grad_norm); --resume auto restarts from the last checkpoint",
              std::isnan(loss_value) ? "NaN" : "infinite", static_cast<long long>(st.step + 1), epoch + 1,
              e.optimizer->lr()));
    // ---- backward (the loss of each micro-batch counts 1/k, so k micro-batches equal one big one)
    timer.begin(Phase::backward);
    const bool last_micro = micro + 1 == accum;
    ctx.reducer.set_sync(last_micro);  // accumulation micro-batches communicate nothing
    scaler.scale_loss(accum > 1 ? F::mul(mb.loss, 1.0 / accum) : mb.loss).backward();
    timer.end(Phase::backward);
    result.loss += loss_value / accum;
    st.samples_seen += mb.batch->labels.numel() * e.world_size;
    result.samples += mb.batch->labels.numel();
    ++st.batch_in_epoch;
    if (last_micro) result.last = std::move(mb);
  }
  // ---- all-reduce: wait for the buckets backward did not finish, average the gradients
  timer.begin(Phase::allreduce_exposed);
  ctx.reducer.finish();
  timer.end(Phase::allreduce_exposed);
  if (ctx.allreduce_open) timer.end(Phase::allreduce_total);
  ctx.allreduce_open = false;
  // ---- optimizer: unscale and check after the all-reduce (every rank skips the same steps), clip,
  // step
  timer.begin(Phase::optimizer);
  const bool finite =
      !scaler.enabled() ||
      (ctx.zero ? scaler.unscale_and_check(ctx.zero->gradients_to_unscale(), ctx.all_ranks_finite)
                : scaler.unscale_and_check(ctx.params, ctx.all_ranks_finite));
  const double lr = e.base_lr * e.schedule->factor(st.step);
  if (finite) {
    if (ctx.config.optim.clip_grad_norm > 0 && !ctx.zero)
      clip_grad_norm(ctx.params, ctx.config.optim.clip_grad_norm);
    e.optimizer->set_lr(lr);
    e.optimizer->step();
  } else {
    ctx.exporter.add_skipped_steps(1);
    ctx.log.line(fmt("step %lld: inf/NaN gradients at loss scale %g, step skipped",
                     static_cast<long long>(st.step + 1), scaler.scale()));
  }
  scaler.update(!finite);
  ctx.exporter.set_loss_scale(scaler.scale());
  e.optimizer->zero_grad();
  timer.end(Phase::optimizer);
  result.lr = lr;
  return result;
}

}  // namespace trainer
