#pragma once
// SyncBatchNorm's training forward as it was before its fused kernels (dist/sync_batch_norm.cpp until
// the Backend::sync_bn_* methods): ~20 generic backend ops per layer in f64 around the same two
// all-reduces. Kept as the reference that the fused path must match (tests/dist, tests/gpu) and
// as the "before" of bench/sync_bn_bench.cpp.
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "dist/comm.h"
#include "nn/backend.h"
#include "nn/functional.h"
#include "nn/modules/batch_norm.h"

namespace trainer {
namespace composed_detail {

// Row i of a [rows, C] tensor as a [C] view.
inline Tensor row(const Tensor& t, int64_t i) { return t.slice(0, i, i + 1).reshape({t.size(1)}); }

// [rows, C] f64 on `device` holding `parts` (each [C], any float dtype) as rows.
inline Tensor pack_f64(const std::vector<Tensor>& parts, Device device) {
  const int64_t C = parts.front().size(0);
  Tensor packed = Tensor::empty({static_cast<int64_t>(parts.size()), C}, DType::f64, device);
  for (size_t i = 0; i < parts.size(); ++i) {
    Tensor dst = packed.slice(0, static_cast<int64_t>(i), static_cast<int64_t>(i) + 1);
    dst.copy_(parts[i].to(DType::f64).reshape({1, C}));
  }
  return packed;
}

// running = (1 - m) * running + m * batch, in place, in running's dtype (as F::batch_norm).
inline void update_running(Tensor& running, const Tensor& batch, double momentum) {
  Backend& k = backend_for(running);
  k.scale(running, 1.0 - momentum);
  k.axpy(running, batch.to(running.dtype()), momentum);
}

}  // namespace composed_detail

inline Variable composed_sync_batch_norm(BatchNorm2d& bn, const Variable& x,
                                         const std::shared_ptr<Comm>& comm_ptr) {
  using namespace composed_detail;
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

  // This rank's statistics as count-weighted sums, so that ranks with different batch sizes combine
  // exactly: sum_r n_r * mean_r = sum x, sum_r n_r * (var_r + mean_r^2) = sum x^2.
  Tensor local_mean, local_var;
  if (local_count > 0) {
    std::tie(local_mean, local_var) = k.bn_mean_var(xd);
  } else {
    local_mean = Tensor::zeros({C}, xd.dtype(), xd.device());
    local_var = Tensor::zeros({C}, xd.dtype(), xd.device());
  }
  const double n = static_cast<double>(local_count);
  const Tensor m64 = local_mean.to(DType::f64), v64 = local_var.to(DType::f64);
  Backend& k64 = backend_for(m64);
  Tensor stats =
      pack_f64({k64.binary_scalar(BinaryOp::mul, m64, n, false),
                k64.binary_scalar(BinaryOp::mul,
                                  k64.binary(BinaryOp::add, v64, k64.unary(UnaryOp::square, m64)), n, false),
                Tensor::full({C}, n, DType::f64, xd.device())},
               xd.device());  // [3, C]
  comm.all_reduce(stats, ReduceOp::sum);
  // The global count per channel stays on the device (row 2): reading it here would stop the host at
  // every SyncBatchNorm layer until the device caught up. Only a rank with at most one value of its
  // own reads it, to refuse a global batch of one as torch does.
  const Tensor total = row(stats, 2);
  if (local_count <= 1) {
    const int64_t count = static_cast<int64_t>(total.slice(0, 0, 1).item());
    if (count <= 1)
      throw std::invalid_argument(
          "SyncBatchNorm: expected more than 1 value per channel over all ranks, got " +
          std::to_string(count) + " (this rank's input " + shape_str(x.shape()) + ")");
  }
  const Tensor mean64 = k64.binary(BinaryOp::div, row(stats, 0), total);
  // E[x^2] - mean^2 can round below zero for a constant channel.
  const Tensor var64 =
      k64.unary(UnaryOp::relu, k64.binary(BinaryOp::sub, k64.binary(BinaryOp::div, row(stats, 1), total),
                                          k64.unary(UnaryOp::square, mean64)));
  // Like torch.nn.SyncBatchNorm: normalise with the biased variance, track the unbiased one.
  const Tensor unbiased =
      k64.binary(BinaryOp::mul, var64,
                 k64.binary(BinaryOp::div, total, k64.binary_scalar(BinaryOp::sub, total, 1.0, false)));
  update_running(bn.running_mean(), mean64, bn.momentum());
  update_running(bn.running_var(), unbiased, bn.momentum());

  const DType stats_dtype = accumulate_dtype(xd.dtype());  // f32 statistics for half inputs
  const Tensor mean = mean64.to(stats_dtype);
  const Tensor invstd =
      k64.binary_scalar(BinaryOp::div,
                        k64.unary(UnaryOp::sqrt, k64.binary_scalar(BinaryOp::add, var64, bn.eps(), false)),
                        1.0, true)
          .to(stats_dtype);
  Tensor y = local_count > 0 ? k.bn_apply(xd, mean, invstd, wd, bd, {}) : xd.clone();

  const bool has_weight = wd.defined(), has_bias = bd.defined(), x_needs_grad = x.requires_grad();
  std::vector<Variable> inputs{x};
  if (has_weight) inputs.push_back(weight);
  if (has_bias) inputs.push_back(bias);
  return record_op(
      "composed_sync_batch_norm", y, inputs,
      [xd, wd, mean, invstd, total, local_count, has_weight, has_bias, x_needs_grad, comm_ptr,
       weight_dtype = has_weight ? wd.dtype() : xd.dtype(),
       bias_dtype = has_bias ? bd.dtype() : xd.dtype()](const Tensor& g) -> std::vector<Tensor> {
        Backend& k = backend_for(g);
        const int64_t C = mean.size(0);
        Tensor sum_dy, sum_dy_xhat;  // this rank's sums, [C]
        if (local_count > 0) {
          std::tie(sum_dy, sum_dy_xhat) = k.bn_backward_reduce(g, xd, mean, invstd, Tensor());
        } else {
          sum_dy = Tensor::zeros({C}, accumulate_dtype(g.dtype()), g.device());
          sum_dy_xhat = Tensor::zeros({C}, accumulate_dtype(g.dtype()), g.device());
        }
        std::vector<Tensor> grads;
        if (x_needs_grad) {
          // grad_x depends on the sums over the global batch: every rank's samples moved the
          // mean and variance this rank normalised with.
          Tensor sums = pack_f64({sum_dy, sum_dy_xhat}, g.device());  // [2, C]
          comm_ptr->all_reduce(sums, ReduceOp::sum);
          // The means over the global batch, divided on the device by its count (so the
          // kernel gets count 1): the count is never read on the host.
          Backend& k64 = backend_for(sums);
          const DType acc = accumulate_dtype(g.dtype());
          grads.push_back(local_count > 0
                              ? k.bn_backward_input(g, xd, mean, invstd, wd,
                                                    k64.binary(BinaryOp::div, row(sums, 0), total).to(acc),
                                                    k64.binary(BinaryOp::div, row(sums, 1), total).to(acc), 1,
                                                    Tensor())
                              : g.clone());
        } else {
          grads.emplace_back();
        }
        if (has_weight) grads.push_back(sum_dy_xhat.to(weight_dtype));
        if (has_bias) grads.push_back(sum_dy.to(bias_dtype));
        return grads;
      });
}

}  // namespace trainer
