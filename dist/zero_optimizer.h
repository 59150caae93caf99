#pragma once
// ZeRO stages 1 and 2 (Rajbhandari et al., 2020; DeepSpeed, PyTorch's ZeroRedundancyOptimizer): the
// optimizer state is sharded over the ranks instead of replicated.
//
// Layout: the trainable parameters are cut into buckets; each bucket is one flat vector of n elements,
// zero-padded to N * c with c = ceil(n / N) for N ranks, and rank r owns its r-th chunk of c elements.
// A rank's shard is its chunks of all buckets, one after the other (S elements); its optimizer moments
// exist for the shard only, so their memory per rank drops from T to S ~ T / N. The padding belongs to
// no parameter: no kernel updates it and no norm counts it.
//   Stage 1: one bucket, the parameters in the wrapped optimizer's group order (rank r owns the
//   contiguous r-th 1/N of the flat vector).
//   Stage 2: GradientReducer's buckets (plan_gradient_buckets: ~25 MiB, reverse registration order,
//   the order backward makes gradients ready), so each bucket can be reduced as soon as it is complete.
//
// Gradients. Each bucket is reduce-scattered (average) into this rank's [S] gradient shard, fp32 like
// the parameters, which accumulates until zero_grad(). Stage 1 does it in step() from the full local
// gradients (one bucket, its flat buffer kept between steps). Stage 2 does it during backward: the
// optimizer owns a GradientReducer whose launcher (gradient_reducer()) copies a complete bucket's
// gradients into a transient flat buffer, reduce-scatters it, adds the result into the shard and
// releases the parameters' grad() at once, so after a synchronised backward no parameter holds a full
// gradient and the peak of backward holds at most the gradients of the buckets being filled.
// Gradient accumulation: set_sync(false) micro-batches accumulate the full gradients locally (as DDP);
// the last micro-batch's backward reduces them. Gradients still present at step() (world size 1, a
// backward without the reducer's sync) are reduced there, bucket by bucket: the result is the same.
//
// One step (every rank):
//   1. the gradient shard is complete (stage 2: waits for the reducer, reduces leftovers);
//   2. optional clipping: the squared norm of each shard is all-reduced, so the coefficient is that of
//      the global norm, exactly as torch.nn.utils.clip_grad_norm_ on the full gradient;
//   3. the wrapped optimizer's kernels (Backend::sgd_step / adamw_step) update the shard, one call per
//      piece of a parameter inside it (pieces differ in weight decay and step count);
//   4. the updated shards are all-gathered into every rank's parameters.
//
// The loss scaler unscales and checks gradients_to_unscale(): stage 1 the local full gradients
// (before the reduction; unscaling is linear), stage 2 the reduced shard; either way the caller agrees
// on the verdict across ranks (any inf/NaN skips the step everywhere).
//
#include <memory>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "dist/gradient_reducer.h"
#include "nn/optim/adamw.h"
#include "nn/optim/optimizer.h"
#include "nn/optim/sgd.h"

namespace trainer {

struct ZeroOptions {
  int stage = 1;               // 1: shard optimizer state; 2: also reduce and free gradients during backward
  double max_grad_norm = 0.0;  // > 0: clip the global gradient norm to this (optim.clip_grad_norm)
  // Stage 2: the model's parameter names in registration order (Module::named_parameters()), which
  // backward reverses; empty: the optimizer's group order (they differ when groups split weight decay).
  std::vector<std::string> registration_order;
  ReducerOptions buckets;  // stage 2: bucket sizes (find_unused_parameters: unused ones reduce zeros)
};

class ZeroOptimizer final : public Optimizer {
 public:
  // Takes over `inner` (an Sgd or AdamW): its parameter groups, options and name. Throws
  // std::invalid_argument for another optimizer, parameters of different dtypes or devices, or a stage
  // other than 1 or 2. Every rank constructs it with the same parameters.
  ZeroOptimizer(std::shared_ptr<Comm> comm, std::unique_ptr<Optimizer> inner, const ZeroOptions& options);

  ~ZeroOptimizer() override;

  // Collective: reduce-scatter what is not reduced yet, clip, update the shard, all-gather. Every
  // trainable parameter must have a gradient (otherwise DistError, after telling the other ranks
  // through Comm::abort).
  void step() override;
  // Drops the parameters' gradients and marks this rank's gradient shard empty (kept allocated).
  void zero_grad() override;

  // Stage 2: the reducer whose grad-ready hooks reduce-scatter each bucket during backward; the training
  // loop drives it like DDP's (set_sync, finish). nullptr at stage 1.
  GradientReducer* gradient_reducer() { return reducer_.get(); }
  // What the loss scaler unscales and checks in place before step() (see the header comment). Stage 2:
  // collective (completes the shard first); throws like step() for a parameter without gradient.
  std::vector<Tensor> gradients_to_unscale();

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
  int64_t padded_numel() const { return shard_ * world_; }  // N * S
  int64_t shard_numel() const { return shard_; }            // S
  // Bytes of optimizer state this rank holds (allocated at construction: the shard's moments).
  int64_t local_state_bytes() const;
  // One line for the start-up log: stage, ranks, shard size, local_state_bytes() and the unsharded size.
  std::string describe() const;

 protected:
  void update(Variable&, const ParamGroup&, ParamState&) override {}  // step() is overridden whole

 private:
  // The part of one parameter inside one rank's shard.
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
    double lr_scale = 1.0;  // its group's (layer-wise LR decay)
    int bucket = 0;
    int64_t bucket_begin = 0;  // offset within its bucket's flat vector
    int64_t steps = 0;         // updates received (the same on every rank)
    bool reduced = false;      // its gradient went into the shard since the last zero_grad()
  };
  struct Bucket {
    std::vector<int> params;  // indices into params_, in flat order
    int64_t numel = 0;        // n, without padding
    int64_t chunk = 0;        // c = ceil(n / N): each rank's part
    int64_t shard_begin = 0;  // where the chunk sits in every rank's shard
    bool in_shard = false;    // reduced into the gradient shard since the last zero_grad()
  };

  void build_layout(const std::vector<std::vector<int>>& buckets);
  std::vector<Piece> pieces_of_rank(int rank) const;
  // Copies parameter `param`'s elements out of every rank's shard, concatenated in `gathered`
  // ([N * S], all_gather_cat's result), into `flat` ([numel]).
  void unshard(const Tensor& gathered, int param, Tensor& flat) const;
  void check_gradients();         // every parameter has a gradient or was reduced, else abort + throw
  void reduce_bucket(int b);      // reduce-scatter bucket b's gradients into the shard (stage 2: free them)
  void reduce_remaining();        // step 1
  void clip(Tensor& grad_shard);  // step 2
  void update_shard(Tensor& param_shard, const Tensor& grad_shard);  // step 3
  Tensor param_shard() const;                         // this rank's range of the current parameters, [S]
  void all_gather_params(const Tensor& param_shard);  // step 4

  std::shared_ptr<Comm> comm_;
  ZeroOptions options_;
  int rank_ = 0, world_ = 1;
  bool adamw_ = false;  // else SGD
  SgdOptions sgd_;
  AdamWOptions adamw_options_;
  std::vector<Param> params_;
  std::vector<Bucket> buckets_;
  std::vector<Piece> pieces_;                // this rank's, in shard order
  std::vector<std::vector<Piece>> located_;  // per parameter: its pieces in every rank's shard, with
                                             // shard_begin offset by rank * S (positions in [N * S])
  int64_t total_ = 0, shard_ = 0;
  std::vector<Tensor> slots_;  // [S] per state slot
  // The largest bucket, padded, kept between steps and reused by every bucket (stage 1: [N * S]).
  Tensor flat_grad_;
  Tensor grad_shard_;  // [S], kept allocated; a bucket's chunk is valid while the bucket is in_shard
  std::unique_ptr<GradientReducer> reducer_;  // stage 2 (inactive at world size 1: no hooks)
  mutable std::vector<Tensor> gathered_;      // rank 0 after gather_state(): [N * S] per slot
};

}  // namespace trainer
