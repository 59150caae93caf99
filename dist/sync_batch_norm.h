#pragma once
// Synchronised batch normalisation, like torch.nn.SyncBatchNorm: in training mode the per-channel
// mean and variance are those of the whole global batch (every rank's samples), not of this rank's
// shard, so N ranks with B/N samples each normalise, track running statistics and back-propagate
// exactly like one process with B samples. Ranks may hold different batch sizes (uneven last
// batches): statistics travel as sums with each rank's count, in f64.
//
// Forward (training): Backend::sync_bn_local_stats writes this rank's [sum x | sum x^2 | count] (f64,
// [2C + 1]) straight from its reduction -> all-reduce(sum) -> Backend::sync_bn_global_stats turns the
// sums into mean and invstd (biased variance) and moves the running statistics (unbiased) in one
// kernel -> bn_apply. Backward: Backend::sync_bn_local_grad_sums (bn_backward_reduce's reduction) writes
// [sum_dy | sum_dy_xhat] divided by the global count -> all-reduce(sum) gives the means ->
// bn_backward_input reads them in place. Per layer and step: a reduction and a [C] kernel forward, a
// reduction backward, the two elementwise passes and two collectives; the count stays on the device
// (one more value in the forward all-reduce), so nothing waits for the host and a CUDA graph captures the
// layer with its all-reduces. Weight and bias gradients stay local sums (the GradientReducer averages them,
// as DDP does with torch's SyncBatchNorm). The two collectives are issued in the same order on every rank
// because every rank runs the same layers in the same order. Evaluation mode uses the running statistics and
// communicates nothing. At world size 1 the module is BatchNorm2d exactly (same kernels, no communication).
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
