#pragma once
// Synchronised batch normalisation, like torch.nn.SyncBatchNorm: in training mode the per-channel
// mean and variance are those of the whole global batch (every rank's samples), not of this rank's
// shard, so N ranks with B/N samples each normalise, track running statistics and back-propagate
// exactly like one process with B samples. Ranks may hold different batch sizes (uneven last
// batches): statistics travel as sums weighted by each rank's count, in f64.
//
// Forward (training): Backend::bn_mean_var locally -> all-reduce(sum) of
// [count * mean, count * (var + mean^2), count] -> global mean and biased variance -> bn_apply.
// Running statistics are updated with the global mean and the unbiased global variance.
// Backward: bn_backward_reduce locally -> all-reduce(sum) of [sum_dy, sum_dy_xhat] -> bn_backward_input
// with the global count. Weight and bias gradients stay local sums (the GradientReducer averages them,
// as DDP does with torch's SyncBatchNorm). Two collectives per BN layer and step, issued in the same
// order on every rank because every rank runs the same layers in the same order.
// Evaluation mode uses the running statistics and communicates nothing. At world size 1 the module is
// BatchNorm2d exactly (same kernels, no communication).
#include <memory>

#include "dist/comm.h"
#include "nn/modules/batch_norm.h"

namespace trainer {

// Same parameters, buffers and names as BatchNorm2d (weight, bias, running_mean, running_var,
// num_batches_tracked), so checkpoints and torchvision names do not change.
class SyncBatchNorm : public BatchNorm2d {
 public:
  SyncBatchNorm(int64_t num_features, std::shared_ptr<Comm> comm, double eps = 1e-5, double momentum = 0.1,
                bool affine = true);
  const std::shared_ptr<Comm>& comm() const { return comm_; }

 private:
  std::shared_ptr<Comm> comm_;
};

// The training forward of `bn` with statistics over every rank of `comm` (what SyncBatchNorm and
// converted BatchNorm2d layers run). Does not count the batch (BatchNorm2d::forward does).
Variable sync_batch_norm(BatchNorm2d& bn, const Variable& x, const std::shared_ptr<Comm>& comm);

// Makes every BatchNorm2d of `model` synchronise its batch statistics over `comm`; returns how many.
// Converted in place: parameters, buffers, names, the optimizer's and the reducer's references stay
// valid (models hold their BN layers by typed pointer, so swapping objects would not reach them).
// Call on every rank, before broadcast_state. At world size 1 the layers are left as they are.
int convert_sync_batchnorm(Module& model, std::shared_ptr<Comm> comm);

// Whether `bn` synchronises its statistics (a SyncBatchNorm, or converted).
bool is_sync_batch_norm(const BatchNorm2d& bn);

}  // namespace trainer
