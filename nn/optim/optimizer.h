#pragma once
// Base of the optimizers: parameter groups, the step loop over parameters whose gradient is defined,
// the learning rate that schedules set every iteration, and the per-parameter state that checkpoints
// save and restore. Subclasses (Sgd, AdamW) name their state slots and call one backend kernel per
// parameter, on the parameter's device.
//
// Checkpoint state: for every parameter of an optimizer that keeps state, "<slot>.<param name>" for
// each slot (zeros when the parameter has not been stepped yet) and "step.<param name>" (an i64
// scalar: how many updates this parameter received; 0 means its state is not initialised, as a
// missing entry in torch.optim's state dict).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "nn/autograd/variable.h"
#include "nn/modules/module.h"

namespace trainer {

// PyTorch's option checks: throws std::invalid_argument("<owner>: invalid <what> <value>") unless ok.
void require_option(const char* owner, bool ok, const std::string& what, double value);

struct ParamGroup {
  std::string name;  // "default", or "decay" / "no_decay" with no_decay_bn_bias ("layer_<i>_..." by layer)
  std::vector<NamedParameter> params;
  double weight_decay = 0.0;
  // The group's learning rate is the optimizer's times this (timm's lr_scale: layer-wise LR decay).
  double lr_scale = 1.0;
};

// Splits parameters into one group with `weight_decay` and, when `no_decay_bn_bias` is set, a
// "no_decay" group with weight decay 0 holding every parameter with at most one dimension or a name
// ending in ".bias" (biases, BatchNorm weights and biases: timm's param_groups_weight_decay). Empty
// groups are left out. layer_decay > 0 (timm's param_groups_layer_decay) splits each of them further by
// layer, with lr_scale layer_decay^(last layer - layer) (nn/optim/layer_decay.h); 0 leaves it off.
std::vector<ParamGroup> make_param_groups(std::vector<NamedParameter> params, double weight_decay,
                                          bool no_decay_bn_bias, double layer_decay = 0.0);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Updates every parameter whose gradient is defined; the others (and their state) stay untouched.
  // Throws std::invalid_argument for a gradient the kernels refuse (shape, dtype, layout); the
  // optimizer's parameters, state and step counts are then unspecified (the trainer stops).
  // Virtual, like state_tensors() and load_state(), for the sharded optimizer (dist/zero_optimizer.h).
  virtual void step();
  // Drops every gradient (PyTorch's set_to_none=True). Virtual for the sharded optimizer, which also
  // resets its gradient shard.
  virtual void zero_grad();

  void set_lr(double lr);  // all groups; schedules call it before every step
  double lr() const { return lr_; }
  // The learning rate of a group's updates: lr() * group.lr_scale.
  double group_lr(const ParamGroup& group) const { return lr_ * group.lr_scale; }
  // Number of step() calls so far (restored by load_state).
  int64_t step_count() const { return step_count_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  const std::string& name() const { return name_; }  // "sgd", "adamw"

  // Names of the per-parameter state tensors ("momentum_buffer", "exp_avg", ...); empty when the
  // optimizer keeps no state (SGD without momentum).
  const std::vector<std::string>& state_slots() const { return slots_; }
  // The state as named tensors, in parameter order; see the header comment for the names.
  virtual std::vector<std::pair<std::string, Tensor>> state_tensors() const;
  // Restores what state_tensors() returned (tensors are copied into this optimizer's own storage on
  // the parameters' devices and dtypes). Throws, changing nothing, on a missing, unexpected,
  // duplicated or mis-shaped entry, naming it.
  virtual void load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t step_count);

  // ---- CUDA graphs. A captured step() freezes its kernels' arguments. After use_device_scalars()
  // (parameters on a CUDA device) the kernels read each step's learning rate (and AdamW's
  // step-dependent factors) from a device buffer instead, and the caller keeps the host side in step:
  //   stage_device_scalars()   before every step(), replayed or not, outside the graph: copies the
  //                            values of the coming step (the lr set last, each parameter's next step
  //                            number) to the device;
  //   count_replayed_step()    after a replay: advances the step counters as the recorded step() did
  //                            (the parameters it updated are the ones the last step() updated).
  void use_device_scalars();
  bool uses_device_scalars() const { return device_scalars_.defined(); }
  void stage_device_scalars();
  void count_replayed_step();

  // ---- a loss scaler kept on the device (LossScaler::keep_on_device). skip_if(flag): the update
  // kernels read the scaler's found-inf flag and leave parameters and state as they are when it is set;
  // the host's step counts still advance. skips_exactly_on_device(): whether the update after such a
  // skipped step is the one torch.optim makes after a step GradScaler skipped (not calling step()).
  // SGD with dampening 0 is, up to the sign of zero: a buffer never written is zeros, and
  // momentum * 0 + 1 * g is the first step's g (where g is -0 the buffer holds +0, torch's clone -0).
  // AdamW is, because its bias correction then counts on the device: counts_updates_on_device()
  // optimizers keep each parameter's count of applied updates in a device vector (applied_steps), which
  // one kernel per step advances unless the flag is set, and which checkpoints save as "step.<param>".
  // skip_if throws for an optimizer that cannot skip exactly. skip_if(nullptr) turns skipping off.
  virtual bool skips_exactly_on_device() const { return false; }
  virtual bool counts_updates_on_device() const { return false; }
  void skip_if(const int64_t* device_flag);

 protected:
  // For subclasses that override step() and load_state().
  void set_step_count(int64_t count) { step_count_ = count; }

  struct ParamState {
    int64_t steps = 0;          // updates received; 0 = uninitialised
    std::vector<Tensor> slots;  // one per state slot, allocated at the first update or on load
  };

  Optimizer(std::string name, std::vector<ParamGroup> groups, double lr, std::vector<std::string> slots);
  // Applies one update to `param` (whose grad is defined and matches) from group `group`.
  // state.steps has already been incremented and the slots allocated (zeros when state.steps == 1).
  virtual void update(Variable& param, const ParamGroup& group, ParamState& state) = 0;

  // One group's updates of a step, in parameter order: update() for each by default; an optimizer whose
  // backend can update many tensors in one launch (Sgd) overrides it.
  struct Update {
    Variable* param;
    ParamState* state;
    const double* device_scalars;  // this parameter's row, or null without use_device_scalars()
    const int64_t* applied_steps;  // this parameter's count of applied updates on the device, or null
  };
  virtual void update_group(const ParamGroup& group, const std::vector<Update>& updates);

  // Device scalars: how many per parameter, and their values for a parameter's update number `step`
  // (1-based) at the current lr. The default is the learning rate alone.
  static constexpr int kMaxDeviceScalars = 4;
  // Writes them to out (at most kMaxDeviceScalars values).
  virtual void device_scalar_values(const ParamGroup& group, int64_t step, double* out) const;
  // The device scalars of the parameter update() is called for, or null without use_device_scalars().
  const double* current_device_scalars() const { return current_device_scalars_; }
  // The flag set by skip_if(), or null.
  const int64_t* skip_flag() const { return skip_flag_; }
  // The count of updates applied to the parameter update() is called for, on its device (see
  // counts_updates_on_device), or null.
  const int64_t* current_applied_steps() const { return current_applied_steps_; }

 private:
  std::string name_;
  std::vector<ParamGroup> groups_;
  std::vector<std::vector<ParamState>> states_;  // parallel to groups_[g].params
  std::vector<std::string> slots_;
  double lr_ = 0.0;
  int64_t step_count_ = 0;
  Tensor device_scalars_;  // f64 [parameters][kMaxDeviceScalars] on the parameters' device
  Tensor host_scalars_;    // the same on the host (pageable), refilled by every stage_device_scalars()
  const double* current_device_scalars_ = nullptr;
  const int64_t* skip_flag_ = nullptr;
  Tensor applied_steps_;  // i64 [parameters] on their device, while skip_if counts there
  const int64_t* current_applied_steps_ = nullptr;
  // Each parameter's count of applied updates: applied_steps_ read back (a host synchronisation) while
  // it counts, else the host's step counts. Parallel to states_.
  std::vector<std::vector<int64_t>> applied_counts() const;
  // The host's step counts, i64 [parameters] on the host, in parameter order over all groups.
  Tensor host_step_counts() const;
  std::vector<std::vector<char>> updated_;  // parallel to groups_[g].params: stepped by the last step()
};

// Scales all defined gradients in place so that their joint L2 norm is at most max_norm
// (torch.nn.utils.clip_grad_norm_: coefficient max_norm / (norm + 1e-6), applied only when below 1), on
// their device with nothing read on the host (Backend::clip_by_total_norm), so a captured step clips
// too. Returns the norm before clipping, f64 [1] on that device (on the CPU without gradients).
// Variables without a gradient are skipped; gradients must be f32 or f64, all on one device.
Tensor clip_grad_norm_on_device(const std::vector<Variable>& params, double max_norm);
// The same, with the norm read on the host.
double clip_grad_norm(const std::vector<Variable>& params, double max_norm);

}  // namespace trainer
