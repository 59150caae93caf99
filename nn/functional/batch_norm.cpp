#include <stdexcept>
#include <string>
#include <tuple>

#include "nn/functional.h"

namespace trainer::F {
namespace {

void check_channel_tensor(const Tensor& t, int64_t C, const char* name) {
  if (t.defined() && (t.dim() != 1 || t.size(0) != C))
    throw std::invalid_argument(std::string("batch_norm: ") + name + " must have shape [" +
                                std::to_string(C) + "], got " + shape_str(t.shape()));
}

// 1 / sqrt(var + eps), on var's device.
Tensor inverse_std(const Tensor& var, double eps) {
  Backend& k = backend_for(var);
  Tensor s = k.unary(UnaryOp::sqrt, k.binary_scalar(BinaryOp::add, var, eps, false));
  return k.binary_scalar(BinaryOp::div, s, 1.0, true);
}

// running = (1 - m) * running + m * factor * batch, in place, in running's dtype.
void update_running(Tensor& running, const Tensor& batch, double momentum, double factor) {
  Backend& k = backend_for(running);
  k.scale(running, 1.0 - momentum);
  k.axpy(running, batch.to(running.dtype()), momentum * factor);
}

// The statistics a forward normalises with: per channel, the mean and 1 / sqrt(var + eps).
struct BnStats {
  Tensor mean, invstd;
};

// The batch's statistics; in training with running statistics, those are updated with the batch's.
BnStats batch_statistics(const Tensor& xd, Tensor& running_mean, Tensor& running_var, bool training,
                         double momentum, double eps, int64_t count) {
  Backend& k = backend_for(xd);
  BnStats s;
  // Like torch.nn.BatchNorm2d: normalise with the biased variance, track the unbiased one.
  Tensor no_running;
  const bool track = training && running_mean.defined();
  // The backend updates f32/f64 running statistics with the batch's in its statistics pass; others
  // (a model cast to a half dtype) are updated here, in their own dtype.
  auto updatable = [](const Tensor& t) { return t.dtype() == DType::f32 || t.dtype() == DType::f64; };
  if (!track || (updatable(running_mean) && updatable(running_var))) {
    std::tie(s.mean, s.invstd) = k.bn_train_stats(xd, eps, momentum, track ? running_mean : no_running,
                                                  track ? running_var : no_running);
  } else {
    const auto [batch_mean, var] = k.bn_mean_var(xd);
    s.mean = batch_mean;
    s.invstd = inverse_std(var, eps);
    const double n = static_cast<double>(count);
    update_running(running_mean, batch_mean, momentum, 1.0);
    update_running(running_var, var, momentum, n / (n - 1.0));
  }
  return s;
}

// Snapshots of the running statistics: a later training step updates the running tensors in place,
// and this graph's backward must see the statistics its forward used.
BnStats running_statistics(const Tensor& xd, const Tensor& running_mean, const Tensor& running_var,
                           double eps) {
  const DType stats = accumulate_dtype(xd.dtype());
  return {running_mean.dtype() == stats ? running_mean.clone() : running_mean.to(stats),
          inverse_std(running_var, eps).to(stats)};
}

// What the backward keeps of a forward: its input, affine parameters and statistics.
struct BnSaved {
  Tensor x, weight, bias;  // weight, bias: undefined when the layer has none
  BnStats stats;
  double eps = 0.0;
  int64_t count = 0;  // values per channel
  bool batch_stats = false, x_needs_grad = false, has_residual = false;
  DType weight_dtype = DType::f32, bias_dtype = DType::f32;  // of the gradients to return
  bool has_weight() const { return weight.defined(); }
  bool has_bias() const { return bias.defined(); }
};

// The backward from the gradient g at the normalisation's output (`mask`: the ReLU's output, applied by
// the batch-norm kernels as they read, or undefined when g is already masked). Returns the gradients
// of x, then weight, bias and residual where the forward had them.
std::vector<Tensor> backward_from_normalised(const BnSaved& s, const Tensor& g, const Tensor& mask) {
  Backend& k = backend_for(g);
  const Tensor &xd = s.x, &wd = s.weight, &mean = s.stats.mean, &invstd = s.stats.invstd;
  // One call where the backend has a faster backward for this input (train.cudnn_batchnorm).
  if (s.batch_stats && s.x_needs_grad && s.has_weight() && s.has_bias())
    if (std::optional<BnGrads> fused = k.bn_backward_fused(g, xd, mean, invstd, wd, s.bias, mask, s.eps)) {
      std::vector<Tensor> grads{fused->grad_x, fused->grad_gamma.to(s.weight_dtype),
                                fused->grad_beta.to(s.bias_dtype)};
      if (s.has_residual) grads.push_back(g);
      return grads;
    }
  Tensor sum_dy, sum_dy_xhat;
  if (s.has_weight() || s.has_bias() || (s.batch_stats && s.x_needs_grad))
    std::tie(sum_dy, sum_dy_xhat) = k.bn_backward_reduce(g, xd, mean, invstd, mask);
  std::vector<Tensor> grads;
  if (!s.x_needs_grad) {
    grads.emplace_back();
  } else if (s.batch_stats) {
    grads.push_back(k.bn_backward_input(g, xd, mean, invstd, wd, sum_dy, sum_dy_xhat, s.count, mask));
  } else {
    // Running statistics are constants: grad_x = dy * invstd * gamma.
    const Tensor zero = Tensor::zeros(mean.shape(), mean.dtype(), mean.device());
    grads.push_back(k.bn_apply(g, zero, invstd, wd, Tensor(), {}));
  }
  if (s.has_weight()) grads.push_back(sum_dy_xhat.to(s.weight_dtype));
  if (s.has_bias()) grads.push_back(sum_dy.to(s.bias_dtype));
  if (s.has_residual) grads.push_back(g);
  return grads;
}

}  // namespace

Variable batch_norm(const Variable& x, const Variable& weight, const Variable& bias, Tensor& running_mean,
                    Tensor& running_var, bool training, double momentum, double eps, const Variable& residual,
                    bool relu) {
  if (x.dim() < 2)
    throw std::invalid_argument("batch_norm: input must be [N, C, ...], got " + shape_str(x.shape()));
  const int64_t C = x.size(1);
  const Tensor xd = x.data();
  const Tensor wd = weight.defined() ? weight.data() : Tensor();
  const Tensor bd = bias.defined() ? bias.data() : Tensor();
  check_channel_tensor(wd, C, "weight");
  check_channel_tensor(bd, C, "bias");
  check_channel_tensor(running_mean, C, "running_mean");
  check_channel_tensor(running_var, C, "running_var");
  if (running_mean.defined() != running_var.defined())
    throw std::invalid_argument(
        "batch_norm: running_mean and running_var must be both defined or both undefined");
  if (!(eps >= 0.0)) throw std::invalid_argument("batch_norm: eps must be non-negative");

  const int64_t count = C == 0 ? 0 : xd.numel() / C;  // values per channel
  // Without running statistics (track_running_stats=False) evaluation also normalises by the batch.
  const bool batch_stats = training || !running_mean.defined();
  if (training && count <= 1)
    throw std::invalid_argument(
        "batch_norm: expected more than 1 value per channel when training, got input " +
        shape_str(x.shape()));
  const bool has_residual = residual.defined();
  if (has_residual && residual.shape() != x.shape())
    throw std::invalid_argument("batch_norm: residual has shape " + shape_str(residual.shape()) +
                                ", input has " + shape_str(x.shape()));
  const BnEpilogue epilogue{has_residual ? residual.data() : Tensor(), relu};
  // One call where the backend has a faster forward for this input (train.cudnn_batchnorm).
  std::optional<BnForward> fused;
  if (training && running_mean.defined() && wd.defined() && bd.defined())
    fused = backend_for(xd).bn_forward_fused(xd, wd, bd, running_mean, running_var, momentum, eps, epilogue);
  const BnStats stats =
      fused ? BnStats{fused->mean, fused->invstd}
            : (batch_stats ? batch_statistics(xd, running_mean, running_var, training, momentum, eps, count)
                           : running_statistics(xd, running_mean, running_var, eps));
  Tensor y = fused ? fused->y : backend_for(xd).bn_apply(xd, stats.mean, stats.invstd, wd, bd, epilogue);
  std::vector<Variable> inputs{x};
  if (wd.defined()) inputs.push_back(weight);
  if (bd.defined()) inputs.push_back(bias);
  if (has_residual) inputs.push_back(residual);
  const BnSaved saved{.x = xd,
                      .weight = wd,
                      .bias = bd,
                      .stats = stats,
                      .eps = eps,
                      .count = count,
                      .batch_stats = batch_stats,
                      .x_needs_grad = x.requires_grad(),
                      .has_residual = has_residual,
                      .weight_dtype = wd.defined() ? wd.dtype() : xd.dtype(),
                      .bias_dtype = bd.defined() ? bd.dtype() : xd.dtype()};
  // Through the ReLU (its output is positive exactly where it passed its input). The batch-norm
  // kernels apply the mask as they read; the masked gradient is made here only where it is needed as
  // a tensor: as the residual's gradient, or for evaluation mode's affine backward.
  const Tensor relu_out = relu ? y : Tensor();
  const bool mask_here = relu && (has_residual || !batch_stats);
  Variable out = record_op("batch_norm", y, inputs, [saved, relu_out, mask_here](const Tensor& g_out) {
    if (!mask_here) return backward_from_normalised(saved, g_out, relu_out);
    return backward_from_normalised(
        saved, backend_for(g_out).unary_backward(UnaryOp::relu, g_out, Tensor(), relu_out), Tensor());
  });
  // A residual block's output usually feeds two ops (the next block's convolution and its shortcut):
  // its gradient arrives in two parts, added in the same pass that applies the ReLU's mask.
  if (mask_here)
    set_backward_of_two(out, [saved, relu_out](const Tensor& a, const Tensor& b) {
      return backward_from_normalised(saved, backend_for(a).relu_backward_of_sum(a, b, relu_out), Tensor());
    });
  return out;
}

}  // namespace trainer::F
