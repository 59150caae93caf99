#pragma once
// One optimizer step of `trainer train`: grad_accum_steps micro-batches of data -> forward -> backward,
// then the gradient all-reduce and the optimizer. The device work is the step function
// (dist/data_parallel_step.h), run eagerly or recorded once as a CUDA graph and replayed; this file feeds
// it the batches and its phase timer, and reads its loss back. The bookkeeping around a step (counters,
// CSV, metrics, log, checkpoints) stays in app/train/train_loop.cpp.
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "data/device_prefetcher.h"
#include "nn/tensor.h"

namespace trainer {

struct TrainingRun;

// One micro-batch's tensors, in the order they are made (and so destroyed in reverse).
struct MicroBatch {
  std::optional<Batch> batch;  // as the loader made it, on the host
  DeviceBatch on_device;
  Tensor images;  // the model's input
  Tensor labels;
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

// Runs one optimizer step (the step function, dist/data_parallel_step.h) on the next micro-batches of
// `input`, timing each phase in the run's timer. Counts the consumed samples and micro-batches in the
// run's state (state.step is left to the caller). Returns nullopt when
// the loader ran out before the step was complete: the step's timing is still open (the caller
// discards it) and its gradients are left for the next epoch's zero_grad(). Throws std::runtime_error
// when a CPU step's loss is not finite (before its update; a GPU step's is checked when it is reported,
// one step later); `epoch` (0-based) is for that message.
std::optional<StepResult> train_step(TrainingRun& run, DevicePrefetcher& input, int epoch);

}  // namespace trainer
