#pragma once
// The one training step: forward and backward over a step's micro-batches, the gradient all-reduce, the
// loss scaler and the optimizer update, read top to bottom in run_step(). `trainer train`'s eager steps,
// its CUDA-graph capture of a step and bench/nn_bench all call it, so that a replayed or benchmarked
// step is the trained step by construction. What differs between them is what they pass: where the
// micro-batches come from, a phase timer or none, the learning rate, a fault-injection hook.
#include <functional>
#include <optional>
#include <vector>

#include "dist/gradient_reducer.h"
#include "dist/step_phases.h"
#include "dist/zero_optimizer.h"
#include "nn/amp/loss_scaler.h"
#include "nn/autograd/variable.h"
#include "nn/modules/module.h"
#include "nn/optim/ema.h"
#include "nn/optim/optimizer.h"
#include "nn/training_loss.h"

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
  // Soft targets (Mixup/CutMix, loss "bce"): the images are mixed and the loss formed from the draws
  // this points at (staged on the device before each micro-batch). Null: plain cross-entropy with
  // label_smoothing above.
  const TrainingLoss* soft_loss = nullptr;
  double clip_grad_norm = 0.0;  // 0: no clipping
  // ema.enabled: the weight average, updated after every optimizer update that was not skipped (on a
  // device loss scaler, skipped on its found-inf flag there), inside the step so a CUDA graph holds it.
  ModelEma* ema = nullptr;
  int accum = 1;  // micro-batches per optimizer step
  // Read each micro-batch's loss on the host before its backward, and stop the step at one that is not
  // finite before anything is updated: free on the CPU; a GPU's losses are read back after the step.
  bool check_losses_on_host = false;
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

// The step's micro-th micro-batch; none when the input has run out.
using MicroBatchSource = std::function<std::optional<StepInput>(int micro)>;

struct StepOutcome {
  enum class End {
    updated,          // the optimizer ran (on a device loss scaler, possibly skipping on its flag there)
    skipped,          // a host loss scaler found inf/NaN gradients: no update, the scale dropped
    input_ran_out,    // the source ran out before the step's last micro-batch: the gradients are left
                      // for the next zero_grad(), nothing is updated
    non_finite_loss,  // check_losses_on_host: the last loss is NaN or inf; stopped before its backward
  };
  End end = End::updated;
  std::vector<Tensor> losses;  // each micro-batch's loss, unscaled (a scalar on the step's device)
  double loss_scale = 1.0;     // the scale the step's backward ran with (a host loss scaler's; 1 otherwise)
};

// Runs one optimizer step on the micro-batches `next_input` gives. `lr`: the learning rate to set before
// the update (none: it is already on the device, as a captured step reads it). `timer` (may be null)
// is told each phase; the allreduce_total interval the reducer's first launch opened is closed when the
// reduce ends. `after_reduce` runs between the reduce and the loss scaler's read of the gradients: the
// one hook, for fault injection (an inf gradient).
StepOutcome run_step(const StepParts& parts, const MicroBatchSource& next_input, std::optional<double> lr,
                     PhaseTimer* timer, const std::function<void()>& after_reduce = {});

// The model's loss on one micro-batch (autocast for bf16/fp16: convolutions and matmuls in half, the
// loss in fp32).
Variable forward_loss(const StepParts& parts, const Tensor& images, const Tensor& labels);

// The learning rate of the coming update, where the optimizer's kernels read it.
void set_step_lr(Optimizer& optimizer, double lr);

}  // namespace trainer
