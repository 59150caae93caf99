#include "dist/data_parallel_step.h"

#include <cmath>

#include "nn/amp/autocast.h"
#include "nn/functional.h"

namespace trainer {
namespace {

// A loss scaler kept on the device: unscale, agree on the found-inf flag, step (the kernels skip on the
// flag), update the scale. Nothing waits for the device, so it can be captured.
void update_with_device_scaler(const StepParts& parts) {
  parts.scaler.unscale_on_device(parts.params, parts.agree_found_inf);
  // After unscaling, as torch's recipe: a non-finite gradient makes the norm non-finite too, and the
  // optimizer skips the step on the scaler's flag anyway.
  if (parts.clip_grad_norm > 0 && !parts.zero) clip_grad_norm_on_device(parts.params, parts.clip_grad_norm);
  parts.optimizer.step();
  if (parts.ema) parts.ema->after_optimizer_step(false, parts.scaler.found_inf_flag());
  parts.scaler.update_on_device();
}

// Without a scaler, or with one deciding on the host: unscale and check (one host read with a scaler),
// then clip (on the device), set the learning rate and step -- or skip. Returns whether the update ran.
bool update_with_host_scaler(const StepParts& parts, std::optional<double> lr) {
  LossScaler& scaler = parts.scaler;
  const bool finite =
      !scaler.enabled() ||
      (parts.zero ? scaler.unscale_and_check(parts.zero->gradients_to_unscale(), parts.all_ranks_finite)
                  : scaler.unscale_and_check(parts.params, parts.all_ranks_finite));
  if (finite) {
    if (parts.clip_grad_norm > 0 && !parts.zero) clip_grad_norm_on_device(parts.params, parts.clip_grad_norm);
    if (lr) set_step_lr(parts.optimizer, *lr);
    parts.optimizer.step();
  }
  if (parts.ema) parts.ema->after_optimizer_step(!finite, nullptr);
  scaler.update(!finite);
  return finite;
}

}  // namespace

Variable forward_loss(const StepParts& parts, const Tensor& images, const Tensor& labels) {
  AutocastScope autocast(parts.autocast);
  if (parts.soft_loss)  // the mixing kernels read the staged draws on the device: captured with the step
    return training_loss(*parts.soft_loss, parts.model(Variable(training_images(*parts.soft_loss, images))),
                         labels);
  return F::cross_entropy(parts.model(Variable(images)), labels, parts.label_smoothing);
}

void set_step_lr(Optimizer& optimizer, double lr) {
  optimizer.set_lr(lr);
  if (optimizer.uses_device_scalars()) optimizer.stage_device_scalars();
}

StepOutcome run_step(const StepParts& parts, const MicroBatchSource& next_input, std::optional<double> lr,
                     PhaseTimer* timer, const std::function<void()>& after_reduce) {
  const auto begin = [timer](Phase p) {
    if (timer) timer->begin(p);
  };
  const auto end = [timer](Phase p) {
    if (timer) timer->end(p);
  };
  StepOutcome outcome;
  // A host scaler's scale, for a skipped step's log line. A device scaler's stays there: reading it would
  // wait for the device (and cannot be captured in a CUDA graph).
  if (!parts.scaler.on_device()) outcome.loss_scale = parts.scaler.scale();
  // Forward and backward of each micro-batch. The loss of each counts 1/accum, so accum micro-batches
  // equal one big one; accumulation micro-batches communicate nothing.
  for (int micro = 0; micro < parts.accum; ++micro) {
    const std::optional<StepInput> input = next_input(micro);
    if (!input) {
      outcome.end = StepOutcome::End::input_ran_out;
      return outcome;
    }
    begin(Phase::forward);
    Variable loss = forward_loss(parts, input->images, input->labels);
    const bool finite = !parts.check_losses_on_host || std::isfinite(loss.item());
    end(Phase::forward);
    outcome.losses.push_back(loss.data());
    if (!finite) {
      outcome.end = StepOutcome::End::non_finite_loss;
      return outcome;
    }
    begin(Phase::backward);
    if (parts.reducer) parts.reducer->set_sync(micro + 1 == parts.accum);
    parts.scaler.scale_loss(parts.accum > 1 ? F::mul(loss, 1.0 / parts.accum) : loss).backward();
    end(Phase::backward);
  }
  // The all-reduce ends before the scaler reads the gradients, so every rank skips the same steps.
  begin(Phase::allreduce_exposed);
  if (parts.reducer) parts.reducer->finish();
  end(Phase::allreduce_exposed);
  if (timer && timer->is_open(Phase::allreduce_total)) timer->end(Phase::allreduce_total);
  if (after_reduce) after_reduce();
  begin(Phase::optimizer);
  if (parts.scaler.on_device()) {
    if (lr) set_step_lr(parts.optimizer, *lr);
    update_with_device_scaler(parts);
  } else if (!update_with_host_scaler(parts, lr)) {
    outcome.end = StepOutcome::End::skipped;
  }
  parts.optimizer.zero_grad();
  end(Phase::optimizer);
  return outcome;
}

}  // namespace trainer
