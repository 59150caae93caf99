#pragma once
// The one step function: forward and backward over a step's micro-batches, the gradient all-reduce, the
// loss scaler and the optimizer update. Eager training steps (app/train/train_step.cpp), the CUDA-graph
// capture of a step (the same call, recorded) and bench/nn_bench all run it, so that a replayed or
// benchmarked step is the trained step by construction. What differs between them -- where the
// batches come from, phase timing, loss read-back, test hooks -- is the StepDriver's.
#include <functional>
#include <optional>
#include <vector>

#include "dist/gradient_reducer.h"
#include "dist/zero_optimizer.h"
#include "metrics/step_timer.h"
#include "nn/amp/loss_scaler.h"
#include "nn/autograd/variable.h"
#include "nn/modules/module.h"
#include "nn/optim/optimizer.h"

namespace trainer {

// What a step works on; set up once for a run (or a benchmark).
struct StepParts {
  Module& model;
  Optimizer& optimizer;
  LossScaler& scaler;
  GradientReducer* reducer = nullptr;  // the DDP reducer or ZeRO stage 2's; null: nothing to reduce
  ZeroOptimizer* zero = nullptr;       // dist.zero_stage > 0: it unscales its own gradients
  const std::vector<Variable>& params;
  std::optional<DType> autocast;  // the precision policy's forward dtype (bf16/fp16), none otherwise
  double label_smoothing = 0.0;
  double clip_grad_norm = 0.0;  // 0: no clipping
  int accum = 1;                // micro-batches per optimizer step
  // Several ranks: combine this rank's "gradients are finite" with the others' (a host loss scaler),
  // or the found-inf flag on the device (a device loss scaler). Empty: this rank decides alone.
  std::function<bool(bool)> all_ranks_finite;
  std::function<void(Tensor&)> agree_found_inf;
};

// One micro-batch's inputs, in the model's input layout on its device.
struct StepInput {
  const Tensor& images;
  const Tensor& labels;
};

// How one kind of step feeds and observes the step function. Every callback but next() does nothing
// by default (a captured or benchmarked step).
class StepDriver {
 public:
  virtual ~StepDriver() = default;
  // The step's micro-th micro-batch; none when the input ran out (the step is then left incomplete).
  virtual std::optional<StepInput> next(int micro) = 0;
  virtual void begin(Phase) {}
  virtual void end(Phase) {}
  // The micro-batch's loss is computed; ends Phase::forward (after reading the loss, where it is read).
  virtual void forward_done(const Variable& loss, int micro) { end(Phase::forward); }
  // Backward has run; the driver keeps the loss as long as it needs it.
  virtual void micro_batch_done(Variable loss, int micro) {}
  // The gradients are reduced (before the loss scaler reads them).
  virtual void reduced() {}
  // The learning rate to set before the update; none when it is already set (on the device).
  virtual std::optional<double> learning_rate() { return std::nullopt; }
  // A host loss scaler found inf/NaN gradients: the update is skipped (called before the scale drops).
  virtual void skipped() {}
  // The loss scaler has decided (on the device or the host), before the gradients are zeroed.
  virtual void scaler_updated() {}
};

// Runs one optimizer step. Returns false when driver.next() ran out before the step was complete: the
// step's gradients are then left for the next zero_grad().
bool run_step(const StepParts& parts, StepDriver& driver);

// The model's loss on one micro-batch (autocast for bf16/fp16: convolutions and matmuls in half, the
// loss in fp32).
Variable forward_loss(const StepParts& parts, const Tensor& images, const Tensor& labels);

// The learning rate of the coming update, where the optimizer's kernels read it.
void set_step_lr(Optimizer& optimizer, double lr);

}  // namespace trainer
