#pragma once
// Data-parallel gradient averaging, like PyTorch DDP's Reducer and flashlight's CoalescingReducer.
// Parameters are grouped into buckets of ~25 MiB in reverse registration order (the order backward
// produces their gradients). When a parameter's gradient is complete its grad-ready hook copies it
// into its bucket's flat buffer; when a bucket is full its all-reduce (average) starts on the
// communicator's thread while backward continues. finish() waits for the buckets and writes the
// averaged gradients back into each parameter's grad(). Buckets start strictly in index order, so
// every rank issues the same collectives in the same order whatever the hooks' timing.
//
// At world size 1 no hook is registered and finish() returns at once: the reducer costs nothing.
//
// Use in the training loop (k = grad_accum_steps):
//   GradientReducer reducer(pg.comm_ptr(), model.named_parameters());
//   for each micro-batch i:
//     reducer.set_sync((i + 1) % k == 0);   // accumulate locally, communicate on the last one
//     loss.backward();
//     if ((i + 1) % k == 0) { reducer.finish(); clip; optimizer.step(); zero_grad(); }
// A parameter that gets no gradient in a synchronised backward is an error naming it (all ranks would
// otherwise wait for its bucket forever), unless find_unused_parameters is on.
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "nn/modules/module.h"

namespace trainer {

struct ReducerOptions {
  size_t bucket_cap_bytes = 25u << 20;
  // The first bucket (the last layers) is small so that communication starts early, as in PyTorch.
  size_t first_bucket_cap_bytes = 1u << 20;
  // Parameters that got no gradient contribute zeros instead of failing (PyTorch's
  // find_unused_parameters); for models whose forward skips layers on some steps.
  bool find_unused_parameters = false;
};

// The buckets GradientReducer forms from `params` (registration order; requires_grad false skipped):
// indices into `params`, bucket by bucket in launch order, each in the order backward makes gradients
// ready (reverse registration order), cut at the byte caps and by (dtype, device). Shared with ZeRO
// stage 2, whose shard layout follows the buckets (dist/zero_optimizer.h).
std::vector<std::vector<int>> plan_gradient_buckets(const std::vector<NamedParameter>& params,
                                                    const ReducerOptions& options);

// What a synchronised backward does with a bucket whose gradients are all ready, instead of the
// all-reduce: called with the bucket's index (launch order, as plan_gradient_buckets numbers them) on the
// thread running backward, strictly in index order; the parameters' grad() hold this backward's
// (accumulated) gradients, or are undefined for unused ones under find_unused_parameters. Returns the
// collective in flight, or nullptr when it finished. ZeRO stage 2 reduce-scatters the bucket into its
// shard and releases the gradients here.
using BucketLauncher = std::function<std::shared_ptr<Work>(int bucket)>;

class GradientReducer {
 public:
  // `params`: the model's named_parameters(); those with requires_grad false are skipped. Without a
  // launcher (DDP) every bucket is all-reduced (average) and finish() writes the averages back into
  // grad(); with one, the launcher owns the reduction and finish() only waits for it (no flat buffers).
  GradientReducer(std::shared_ptr<Comm> comm, const std::vector<NamedParameter>& params,
                  const ReducerOptions& options = {}, BucketLauncher launcher = {});
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Whether the next backward communicates (default true). Off for the micro-batches of gradient
  // accumulation that only accumulate locally (PyTorch's no_sync()).
  void set_sync(bool sync);
  bool sync() const;
  // After a synchronised backward: waits for every bucket and writes the averaged gradients into the
  // parameters' grad(). Throws DistError naming the parameters that got no gradient (and tells the
  // other ranks, so nobody waits). Does nothing when sync is off or at world size 1.
  void finish();

  // Called when the first bucket of a synchronised backward is launched, on the thread running
  // backward (the training loop starts its allreduce_total phase there). Returns the one it replaces.
  std::function<void()> set_first_launch_observer(std::function<void()> observer);

  bool active() const;  // world size > 1
  // A synchronised backward has delivered gradients since the last finish().
  bool pending() const;
  int bucket_count() const;
  // Parameter names per bucket, in launch order (for the start-up log and tests).
  std::vector<std::vector<std::string>> bucket_parameter_names() const;
  // How long the last finish() waited for communication that backward did not hide.
  double last_wait_seconds() const;
  // How many buckets the last synchronised backward launched from its hooks, before finish(): all of
  // them when every parameter got its gradient, i.e. communication overlapped backward.
  int last_buckets_launched_in_backward() const;

  struct State;

 private:
  std::shared_ptr<State> state_;  // hooks hold a weak_ptr: they become no-ops once the reducer is gone
};

// Scoped set_sync(false): { NoSyncGuard g(reducer); loss.backward(); } accumulates without communicating.
class NoSyncGuard {
 public:
  explicit NoSyncGuard(GradientReducer& reducer) : reducer_(reducer), previous_(reducer.sync()) {
    reducer.set_sync(false);
  }
  ~NoSyncGuard() { reducer_.set_sync(previous_); }
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;

 private:
  GradientReducer& reducer_;
  bool previous_;
};

// Scoped: no first-launch observer (a backward captured into a CUDA graph is not timed by phase).
class PauseFirstLaunchObserver {
 public:
  explicit PauseFirstLaunchObserver(GradientReducer& reducer)
      : reducer_(reducer), paused_(reducer.set_first_launch_observer({})) {}
  ~PauseFirstLaunchObserver() { reducer_.set_first_launch_observer(std::move(paused_)); }
  PauseFirstLaunchObserver(const PauseFirstLaunchObserver&) = delete;
  PauseFirstLaunchObserver& operator=(const PauseFirstLaunchObserver&) = delete;

 private:
  GradientReducer& reducer_;
  std::function<void()> paused_;
};

// Copies rank `root`'s parameters and buffers (a module's state_dict()) into every rank, so all ranks
// start from identical weights and BatchNorm statistics whatever their seeds. Checks first that every
// rank has the same names, shapes and dtypes (an error names the ranks that differ). One broadcast
// per dtype, not per tensor.
void broadcast_state(Comm& comm, const std::vector<NamedTensor>& state, int root = 0);

}  // namespace trainer
