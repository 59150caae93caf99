#pragma once
// ZeRO stages 1 and 2 (Rajbhandari et al., 2020; DeepSpeed, PyTorch's ZeroRedundancyOptimizer): the
// optimizer state is sharded over the ranks instead of replicated.
//
// Layout: the trainable parameters, in the wrapped optimizer's group order, form one flat vector of T
// elements, zero-padded to P = N * ceil(T / N) for N ranks; rank r owns the contiguous range
// [r * P / N, (r + 1) * P / N). Its optimizer moments exist for that range only, so their memory per
// rank drops from T to P / N elements. The padding belongs to no parameter: no kernel updates it and
// no norm counts it.
//
// One step (every rank, after the local backward; the GradientReducer must stay idle):
//   1. the local gradients are copied into a flat [P] buffer and reduce-scattered (average): each rank
//      receives the averaged gradient of its shard only;
//   2. optional clipping: the squared norm of each shard is all-reduced, so the coefficient is that of
//      the global norm, exactly as torch.nn.utils.clip_grad_norm_ on the full gradient;
//   3. the wrapped optimizer's kernels (Backend::sgd_step / adamw_step) update the shard, one call per
//      piece of a parameter inside it (pieces differ in weight decay and step count);
//   4. the updated shards are all-gathered into every rank's parameters.
// Stage 1 keeps the flat gradient buffer between steps (no allocation per step); stage 2 frees each
// parameter's gradient as soon as it is copied into the buffer and the buffer as soon as it is reduced,
// so only the [P / N] shard of gradients outlives the reduce-scatter. Not done (yet): reducing buckets
// from gradient-ready hooks during backward, as DeepSpeed's stage 2 does; here the full gradients exist
// at the end of backward (where the loss scaler checks them), so stage 2 lowers the memory of the
// update and the all-gather, not the peak at the end of backward.
//
// Gradient accumulation needs nothing: micro-batches accumulate into the parameters' gradients and the
// reduction happens once, in step(). The loss scaler may unscale and check the local gradients before
// step() (unscaling is linear and every rank agrees on the inf/NaN verdict).
//
// Checkpoints: state_tensors() has exactly the names and shapes of the wrapped optimizer's (a sharded
// run's checkpoint is an ordinary one). Rank 0 writes alone, so every rank first calls gather_state(),
// the collective that assembles the full state on rank 0; load_state() takes the full state on every
// rank and keeps its shard.
#include <memory>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "nn/optim/adamw.h"
#include "nn/optim/optimizer.h"
#include "nn/optim/sgd.h"

namespace trainer {

struct ZeroOptions {
  int stage = 1;               // 1: shard optimizer state; 2: also free the unsharded gradients early
  double max_grad_norm = 0.0;  // > 0: clip the global gradient norm to this (optim.clip_grad_norm)
};

class ZeroOptimizer final : public Optimizer {
 public:
  // Takes over `inner` (an Sgd or AdamW): its parameter groups, options and name. Throws
  // std::invalid_argument for another optimizer, parameters of different dtypes or devices, or a stage
  // other than 1 or 2. Every rank constructs it with the same parameters.
  ZeroOptimizer(std::shared_ptr<Comm> comm, std::unique_ptr<Optimizer> inner, const ZeroOptions& options);

  // Collective: reduce-scatter, clip, update the shard, all-gather. Every trainable parameter must have
  // a gradient (otherwise DistError, after telling the other ranks through Comm::abort).
  void step() override;

  // Collective: assembles the full state on rank 0 for the next state_tensors() there.
  void gather_state();
  // Full state in the wrapped optimizer's format. Rank 0 after gather_state(), or any rank at world
  // size 1; elsewhere std::logic_error. Releases the gathered copy.
  std::vector<std::pair<std::string, Tensor>> state_tensors() const override;
  // The full state (as state_tensors() returns it), on every rank; each keeps its shard. Throws,
  // changing nothing, on a missing, unexpected or mis-shaped entry, naming it.
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t step_count) override;

  int stage() const { return options_.stage; }
  int64_t flat_numel() const { return total_; }             // T: trainable elements
  int64_t padded_numel() const { return shard_ * world_; }  // P
  int64_t shard_numel() const { return shard_; }            // P / N
  // Bytes of optimizer state this rank holds (allocated at construction: the shard's moments).
  int64_t local_state_bytes() const;
  // One line for the start-up log: stage, ranks, shard size, local_state_bytes() and the unsharded size.
  std::string describe() const;

 protected:
  void update(Variable&, const ParamGroup&, ParamState&) override {}  // step() is overridden whole

 private:
  // The part of one parameter inside this rank's shard.
  struct Piece {
    int param = 0;            // index into params_
    int64_t param_begin = 0;  // offset within the parameter's (logical, row-major) elements
    int64_t shard_begin = 0;  // offset within the shard
    int64_t length = 0;
  };
  struct Param {
    std::string name;
    Variable var;
    double weight_decay = 0.0;
    int64_t flat_begin = 0;  // offset within the flat vector
    int64_t steps = 0;       // updates received (the same on every rank)
  };

  Tensor reduce_gradients();      // step 1: this rank's [shard_] of the averaged gradient
  void clip(Tensor& grad_shard);  // step 2
  void update_shard(Tensor& param_shard, const Tensor& grad_shard);  // step 3
  Tensor param_shard() const;                         // this rank's range of the current parameters, [shard_]
  void all_gather_params(const Tensor& param_shard);  // step 4

  std::shared_ptr<Comm> comm_;
  ZeroOptions options_;
  int rank_ = 0, world_ = 1;
  bool adamw_ = false;  // else SGD
  SgdOptions sgd_;
  AdamWOptions adamw_options_;
  std::vector<Param> params_;
  std::vector<Piece> pieces_;  // this rank's, in flat order
  int64_t total_ = 0, shard_ = 0;
  std::vector<Tensor> slots_;             // [shard_] per state slot
  Tensor flat_grad_;                      // stage 1: [P], kept between steps
  mutable std::vector<Tensor> gathered_;  // rank 0 after gather_state(): [P] per slot
};

}  // namespace trainer
