#pragma once
// An exponential moving average of a model's weights, timm's ModelEmaV3: every floating entry of the
// state dict (parameters, and BatchNorm's running statistics unless `average_buffers` is off, when they
// are copied as ModelEmaV3(exclude_buffers=True) does) becomes lerp(average, value, 1 - decay) after an
// optimizer update; integer buffers are copied. The decay of the k-th update is ModelEmaV3's
// get_decay(k * every_steps) (nn/optim/update_rules.h: the first update copies the weights, then
// `decay`, or with the warm-up 1 - (1 + t / gamma)^-power clamped to [min_decay, decay]); with
// every_steps 1 and no skipped step, k is timm's num_updates.
//
// One backend call per update (one multi-tensor kernel on a GPU) that decides nothing on the host:
// the count of applied updates lives on the parameters' device, the loss scaler's found-inf flag skips
// an update there, and under a CUDA graph the every-N-steps verdict is a staged device value. So the
// update sits inside the captured step, and a replay equals an eager step.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "nn/backend.h"
#include "nn/modules/module.h"

namespace trainer {

struct EmaOptions {
  double decay = 0.9999;  // in [0, 1)
  bool warmup = false;
  double warmup_gamma = 1.0;        // > 0
  double warmup_power = 2.0 / 3.0;  // > 0
  double min_decay = 0.0;           // in [0, decay]
  int64_t every_steps = 1;          // >= 1
  bool average_buffers = true;      // false: floating buffers are copied, not averaged
};

class ModelEma {
 public:
  // Starts the average as a copy of the model's state (its parameters and buffers must stay where they
  // are: the average keeps pointers into the model). Throws std::invalid_argument on invalid options.
  ModelEma(Module& model, const EmaOptions& options);
  ModelEma(const ModelEma&) = delete;
  ModelEma& operator=(const ModelEma&) = delete;

  // After every optimizer step of the run, applied or not: counts the step and, on every every_steps-th,
  // updates the average unless the step was skipped: `skipped` on the host (a host loss scaler found
  // inf/NaN), or *skip_if on the device (a device loss scaler's flag; may be null).
  void after_optimizer_step(bool skipped, const int64_t* skip_if);

  // ---- CUDA graphs (every_steps > 1 only; otherwise every step updates and nothing is staged).
  // stage_gate() before a step that is captured or replayed: writes whether the coming step updates to
  // the device, where the recorded kernels read it. count_replayed_step() after a replay, as the optimizer's.
  void stage_gate();
  // The replay consumed the staged verdict: an eager step after it (a short last batch) decides on the
  // host again instead of reading the previous replay's gate.
  void count_replayed_step() {
    ++steps_;
    gate_staged_ = false;
  }

  // Optimizer steps seen, and updates applied (a host read of the device count: a synchronisation).
  int64_t steps() const { return steps_; }
  int64_t updates() const;
  const EmaOptions& options() const { return options_; }
  // The average's memory: its copy of every state-dict entry (parameters and buffers) in that entry's
  // dtype, on the model's device (`trainer plan` counts it per rank).
  int64_t bytes() const;

  // The average, by the model's state-dict names (copies, for checkpoints), and the restore. load_state
  // throws, changing nothing, on a missing, unexpected or mis-shaped entry, naming it.
  std::vector<std::pair<std::string, Tensor>> state_tensors() const;
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps, int64_t updates);

  // Starts the average again as a copy of the model's current state, with no update applied yet (the
  // next one copies, as the first does) and `steps` optimizer steps seen.
  void restart_from_model(int64_t steps);

  // Copies the average into the model (all of its state dict), e.g. to evaluate it, and back: the
  // model's state becomes the average (after the ranks averaged its BatchNorm statistics, say).
  void copy_to_model() const;
  void copy_from_model();

 private:
  EmaOptions options_;
  std::vector<NamedTensor> model_state_;  // into the model
  std::vector<Tensor> averages_;          // parallel to model_state_
  Tensor updates_;                        // i64 [1] on the parameters' device
  Tensor gate_, host_gate_;               // i64 [1] on the device and the host, once stage_gate() ran
  bool gate_staged_ = false;              // the device gate holds the coming step's verdict
  int64_t steps_ = 0;
};

// Evaluates the average in place of the model's weights: copies the model's state aside, the average in,
// and the model's state back when it ends (the model's tensors keep their storage, so a captured graph
// still reads them).
class EmaWeightsScope {
 public:
  EmaWeightsScope(Module& model, const ModelEma& ema);
  ~EmaWeightsScope();
  EmaWeightsScope(const EmaWeightsScope&) = delete;
  EmaWeightsScope& operator=(const EmaWeightsScope&) = delete;

 private:
  std::vector<NamedTensor> state_;
  std::vector<Tensor> saved_;
};

}  // namespace trainer
