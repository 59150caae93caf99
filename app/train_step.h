#pragma once
// One optimizer step of `trainer train`: grad_accum_steps micro-batches of data -> forward -> backward,
// then the gradient all-reduce and the optimizer. All the work a step issues to the device is in
// train_step(), so that capturing the step (a CUDA graph) changes this one function; the bookkeeping
// around it (counters, CSV, metrics, log, checkpoints) stays in app/train_loop.cpp.
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "app/checkpoint.h"
#include "app/config.h"
#include "app/experiment.h"
#include "data/device_prefetcher.h"
#include "dist/gradient_reducer.h"
#include "dist/zero_optimizer.h"
#include "metrics/exporter.h"
#include "metrics/log.h"
#include "metrics/step_timer.h"
#include "nn/amp/loss_scaler.h"

namespace trainer {

class HostReadback;
class StepGraph;

// Test hook TRAINER_TEST_STALL="RANK:STEP:SECONDS": that rank waits in data_wait before that step (a
// stuck data loader), so the others' collective times out. rank -1: no stall.
struct StallHook {
  int rank = -1;
  long long step = -1;
  double seconds = 0;
};
StallHook stall_hook_from_env();

// Test hook TRAINER_TEST_INF_GRAD="RANK:STEP": on that rank, at that step (1-based, as the log counts),
// the first parameter's gradient becomes inf after the all-reduce, as if only this rank had overflowed;
// the ranks must still skip that step together. Eager steps only. rank -1: none.
struct InfGradHook {
  int rank = -1;
  long long step = -1;
};
InfGradHook inf_grad_hook_from_env();

// What every step of a run works with; run_training sets it up once, before the first epoch.
struct StepContext {
  const Config& config;
  Experiment& e;
  Device device;
  MemoryFormat input_format;        // of the images the model takes
  std::optional<DType> half_dtype;  // autocast's dtype for bf16/fp16, none for fp32
  int accum;                        // train.grad_accum_steps: micro-batches per optimizer step
  const std::vector<Variable>& params;
  GradientReducer& reducer;  // the DDP reducer, or ZeRO stage 2's own
  ZeroOptimizer* zero;       // dist.zero_stage > 0; null otherwise
  LossScaler& scaler;
  // Combines this rank's "gradients are finite" with every other rank's (all must be).
  std::function<bool(bool)> all_ranks_finite;
  // A loss scaler kept on the device (scaler.on_device()): the same agreement on the found-inf flag, an
  // all-reduce (max) on the device at several ranks; empty at one.
  std::function<void(Tensor&)> agree_found_inf;
  StepTimer& timer;
  // Set by the reducer's first-launch observer when it opened allreduce_total; the step closes it.
  bool& allreduce_open;
  Exporter& exporter;
  Log& log;
  int rank;
  StallHook stall;
  InfGradHook inf_grad;
  // train.cuda_graph where step_graph_blocker() allows it: full-size steps replay a CUDA graph; null
  // otherwise (every step eager).
  StepGraph* graph = nullptr;
  HostReadback& readback;  // on a GPU, losses come back to the host without stopping it
};

// One micro-batch's tensors, in the order they are made (and so destroyed in reverse).
struct MicroBatch {
  std::optional<Batch> batch;  // as the loader made it, on the host
  DeviceBatch on_device;
  Tensor images;  // the model's input
  Tensor labels;
  Variable loss;
};

struct StepResult {
  double loss = 0.0;  // this rank's loss, the mean over the step's micro-batches (unless pending)
  // On a GPU the loss is still on its way to the host (HostReadback): this waits for it and returns it.
  std::function<double()> pending_loss;
  // A loss scaler kept on the device: its skipped-step count and scale after this step, on their way
  // to the host like the loss (null otherwise; the host scaler logs a skipped step at once).
  std::function<double()> pending_skipped_steps;
  std::function<double()> pending_loss_scale;
  double lr = 0.0;      // the schedule's learning rate for this step (also when the step was skipped)
  int64_t samples = 0;  // this rank's samples in the step
  // The last micro-batch, alive until the caller drops the result after recording the step: the device
  // memory the exporter reports after a step has always included it.
  MicroBatch last;
};

// Stops the run when a step's loss is not finite (NaN or inf), naming the step (1-based), the epoch
// (0-based) and the learning rate, with a hint.
void check_loss_is_finite(double loss, int64_t step, int epoch, double lr);

// Runs one optimizer step on the next micro-batches of `input`, timing each phase in ctx.timer. Counts
// the consumed samples and micro-batches in `st` (st.step is left to the caller). Returns nullopt when
// the loader ran out before the step was complete: the step's timing is still open (the caller
// discards it) and its gradients are left for the next epoch's zero_grad(). Throws std::runtime_error
// when a CPU step's loss is not finite (before its update; a GPU step's is checked when it is reported,
// one step later); `epoch` (0-based) is for that message.
std::optional<StepResult> train_step(StepContext& ctx, DevicePrefetcher& input, TrainingState& st, int epoch);

}  // namespace trainer
