#include "dist/sync_batch_norm.h"

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "nn/backend.h"
#include "nn/functional.h"

namespace trainer {
namespace {

bool updatable_in_place(const Tensor& running) {
  return running.dtype() == DType::f32 || running.dtype() == DType::f64;
}

// mean and invstd from every rank's sums `stats`, moving bn's running statistics towards the global
// batch's. Running statistics in a half dtype (a model cast to it) move in f32 copies.
std::pair<Tensor, Tensor> global_stats(Backend& k, BatchNorm2d& bn, const Tensor& stats, DType stats_dtype) {
  Tensor& running_mean = bn.running_mean();
  Tensor& running_var = bn.running_var();
  if (updatable_in_place(running_mean) && updatable_in_place(running_var))
    return k.sync_bn_global_stats(stats, stats_dtype, bn.eps(), bn.momentum(), running_mean, running_var);
  Tensor mean32 = running_mean.to(DType::f32), var32 = running_var.to(DType::f32);
  auto result = k.sync_bn_global_stats(stats, stats_dtype, bn.eps(), bn.momentum(), mean32, var32);
  running_mean.copy_(mean32);
  running_var.copy_(var32);
  return result;
}

}  // namespace

Variable sync_batch_norm(BatchNorm2d& bn, const Variable& x, const std::shared_ptr<Comm>& comm_ptr) {
  Comm& comm = *comm_ptr;
  if (x.dim() != 4 || x.size(1) != bn.num_features())
    throw std::invalid_argument("SyncBatchNorm(" + std::to_string(bn.num_features()) +
                                ") expects input [N, C, H, W], got " + shape_str(x.shape()));
  const int64_t C = x.size(1);
  const Tensor xd = x.data();
  const Variable weight = bn.weight(), bias = bn.bias();
  const Tensor wd = weight.defined() ? weight.data() : Tensor();
  const Tensor bd = bias.defined() ? bias.data() : Tensor();
  Backend& k = backend_for(xd);
  const int64_t local_count = xd.numel() / C;  // values per channel on this rank (0 for an empty batch)

  // [sum x (C) | sum x^2 (C) | values per channel], f64: this rank's, written by the statistics'
  // reduction itself, then every rank's. Sums, not moments, so that ranks with different batch sizes
  // combine exactly; the count travels with them (one value), so no rank needs to know the others'.
  Tensor stats = Tensor::empty({2 * C + 1}, DType::f64, xd.device());
  k.sync_bn_local_stats(xd, stats);
  comm.all_reduce(stats, ReduceOp::sum);
  // The global count stays on the device: reading it here would stop the host at every SyncBatchNorm
  // layer until the device caught up. Only a rank with at most one value of its own reads it, to
  // refuse a global batch of one as torch does.
  if (local_count <= 1) {
    const int64_t count = static_cast<int64_t>(stats.slice(0, 2 * C, 2 * C + 1).item());
    if (count <= 1)
      throw std::invalid_argument(
          "SyncBatchNorm: expected more than 1 value per channel over all ranks, got " +
          std::to_string(count) + " (this rank's input " + shape_str(x.shape()) + ")");
  }
  // Like torch.nn.SyncBatchNorm: normalise with the biased variance, track the unbiased one. f32
  // statistics for half inputs.
  const auto [mean, invstd] = global_stats(k, bn, stats, accumulate_dtype(xd.dtype()));
  Tensor y = local_count > 0 ? k.bn_apply(xd, mean, invstd, wd, bd, {}) : xd.clone();

  const bool has_weight = wd.defined(), has_bias = bd.defined(), x_needs_grad = x.requires_grad();
  std::vector<Variable> inputs{x};
  if (has_weight) inputs.push_back(weight);
  if (has_bias) inputs.push_back(bias);
  return record_op(
      "sync_batch_norm", y, inputs,
      [xd, wd, mean = mean, invstd = invstd, stats, local_count, has_weight, has_bias, x_needs_grad, comm_ptr,
       weight_dtype = has_weight ? wd.dtype() : xd.dtype(),
       bias_dtype = has_bias ? bd.dtype() : xd.dtype()](const Tensor& g) -> std::vector<Tensor> {
        Backend& k = backend_for(g);
        const int64_t C = mean.size(0);
        // [sum dy | sum dy * xhat] / global count, f64: this rank's share, then (all-reduced) the
        // means over the global batch. sum_dy and sum_dy_xhat are this rank's sums.
        Tensor means = Tensor::empty({2 * C}, DType::f64, g.device());
        const auto [sum_dy, sum_dy_xhat] = k.sync_bn_local_grad_sums(g, xd, mean, invstd, stats, means);
        std::vector<Tensor> grads;
        if (x_needs_grad) {
          // grad_x depends on the sums over the global batch: every rank's samples moved the
          // mean and variance this rank normalised with. The means are read in place, in f64.
          comm_ptr->all_reduce(means, ReduceOp::sum);
          grads.push_back(local_count > 0 ? k.bn_backward_input(g, xd, mean, invstd, wd, means.slice(0, 0, C),
                                                                means.slice(0, C, 2 * C), 1, Tensor())
                                          : g.clone());
        } else {
          grads.emplace_back();
        }
        // Weight and bias gradients stay this rank's sums (the GradientReducer averages them).
        if (has_weight) grads.push_back(sum_dy_xhat.to(weight_dtype));
        if (has_bias) grads.push_back(sum_dy.to(bias_dtype));
        return grads;
      });
}

SyncBatchNorm::SyncBatchNorm(int64_t num_features, std::shared_ptr<Comm> comm, double eps, double momentum,
                             bool affine)
    : BatchNorm2d(num_features, eps, momentum, affine), comm_(std::move(comm)) {
  if (!comm_) throw std::invalid_argument("SyncBatchNorm: communicator is null");
  if (comm_->world_size() > 1) {
    set_training_forward(
        [comm = comm_](BatchNorm2d& bn, const Variable& x) { return sync_batch_norm(bn, x, comm); });
  }
}

int convert_sync_batchnorm(Module& model, std::shared_ptr<Comm> comm) {
  if (!comm) throw std::invalid_argument("convert_sync_batchnorm: communicator is null");
  int converted = 0;
  for (auto& [name, m] : model.named_modules()) {
    auto* bn = dynamic_cast<BatchNorm2d*>(m);
    if (!bn) continue;
    ++converted;
    if (comm->world_size() == 1) continue;  // exactly BatchNorm2d
    bn->set_training_forward(
        [comm](BatchNorm2d& self, const Variable& x) { return sync_batch_norm(self, x, comm); });
  }
  return converted;
}

bool is_sync_batch_norm(const BatchNorm2d& bn) { return bn.has_training_forward(); }

}  // namespace trainer
