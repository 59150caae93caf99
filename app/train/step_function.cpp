#include "app/train/step_function.h"

#include "nn/amp/autocast.h"
#include "nn/functional.h"

namespace trainer {
namespace {

// A loss scaler kept on the device: unscale, agree on the found-inf flag, step (the kernels skip on the
// flag), update the scale. Nothing waits for the device, so it can be captured.
void update_with_device_scaler(const StepParts& parts) {
  parts.scaler.unscale_on_device(parts.params, parts.agree_found_inf);
  parts.optimizer.step();
  parts.scaler.update_on_device();
}

// Without a scaler, or with one deciding on the host: unscale and check (one host read), then clip and
// step, or skip.
void update_with_host_scaler(const StepParts& parts, StepDriver& driver, std::optional<double> lr) {
  LossScaler& scaler = parts.scaler;
  const bool finite =
      !scaler.enabled() ||
      (parts.zero ? scaler.unscale_and_check(parts.zero->gradients_to_unscale(), parts.all_ranks_finite)
                  : scaler.unscale_and_check(parts.params, parts.all_ranks_finite));
  if (finite) {
    if (parts.clip_grad_norm > 0 && !parts.zero) clip_grad_norm(parts.params, parts.clip_grad_norm);
    if (lr) set_step_lr(parts.optimizer, *lr);
    parts.optimizer.step();
  } else {
    driver.skipped();
  }
  scaler.update(!finite);
}

// forward and backward of one micro-batch (the loss of each counts 1/accum, so accum micro-batches equal
// one big one). Accumulation micro-batches communicate nothing.
void forward_backward(const StepParts& parts, StepDriver& driver, const StepInput& input, int micro) {
  driver.begin(Phase::forward);
  Variable loss = forward_loss(parts, input.images, input.labels);
  driver.forward_done(loss, micro);
  driver.begin(Phase::backward);
  if (parts.reducer) parts.reducer->set_sync(micro + 1 == parts.accum);
  parts.scaler.scale_loss(parts.accum > 1 ? F::mul(loss, 1.0 / parts.accum) : loss).backward();
  driver.end(Phase::backward);
  driver.micro_batch_done(std::move(loss), micro);
}

}  // namespace

Variable forward_loss(const StepParts& parts, const Tensor& images, const Tensor& labels) {
  AutocastScope autocast(parts.autocast);
  return F::cross_entropy(parts.model(Variable(images)), labels, parts.label_smoothing);
}

void set_step_lr(Optimizer& optimizer, double lr) {
  optimizer.set_lr(lr);
  if (optimizer.uses_device_scalars()) optimizer.stage_device_scalars();
}

bool run_step(const StepParts& parts, StepDriver& driver) {
  for (int micro = 0; micro < parts.accum; ++micro) {
    const std::optional<StepInput> input = driver.next(micro);
    if (!input) return false;
    forward_backward(parts, driver, *input, micro);
  }
  // The all-reduce ends before the scaler reads the gradients, so every rank skips the same steps.
  driver.begin(Phase::allreduce_exposed);
  if (parts.reducer) parts.reducer->finish();
  driver.end(Phase::allreduce_exposed);
  driver.reduced();
  driver.begin(Phase::optimizer);
  const std::optional<double> lr = driver.learning_rate();
  if (parts.scaler.on_device()) {
    if (lr) set_step_lr(parts.optimizer, *lr);
    update_with_device_scaler(parts);
  } else {
    update_with_host_scaler(parts, driver, lr);
  }
  driver.scaler_updated();
  parts.optimizer.zero_grad();
  driver.end(Phase::optimizer);
  return true;
}

}  // namespace trainer
