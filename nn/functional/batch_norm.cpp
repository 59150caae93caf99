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

  Backend& k = backend_for(xd);
  const int64_t count = C == 0 ? 0 : xd.numel() / C;  // values per channel
  // Without running statistics (track_running_stats=False) evaluation also normalises by the batch.
  const bool batch_stats = training || !running_mean.defined();
  Tensor mean, invstd;
  if (batch_stats) {
    if (training && count <= 1)
      throw std::invalid_argument(
          "batch_norm: expected more than 1 value per channel when training, got input " +
          shape_str(x.shape()));
    // Like torch.nn.BatchNorm2d: normalise with the biased variance, track the unbiased one.
    Tensor no_running;
    const bool track = training && running_mean.defined();
    // The backend updates f32/f64 running statistics with the batch's in its statistics pass; others
    // (a model cast to a half dtype) are updated here, in their own dtype.
    auto updatable = [](const Tensor& t) { return t.dtype() == DType::f32 || t.dtype() == DType::f64; };
    if (!track || (updatable(running_mean) && updatable(running_var))) {
      std::tie(mean, invstd) = k.bn_train_stats(xd, eps, momentum, track ? running_mean : no_running,
                                                track ? running_var : no_running);
    } else {
      const auto [batch_mean, var] = k.bn_mean_var(xd);
      mean = batch_mean;
      invstd = inverse_std(var, eps);
      const double n = static_cast<double>(count);
      update_running(running_mean, batch_mean, momentum, 1.0);
      update_running(running_var, var, momentum, n / (n - 1.0));
    }
  } else {
    // Snapshots: a later training step updates the running tensors in place, and this graph's
    // backward must see the statistics its forward used.
    const DType stats = accumulate_dtype(xd.dtype());
    mean = running_mean.dtype() == stats ? running_mean.clone() : running_mean.to(stats);
    invstd = inverse_std(running_var, eps).to(stats);
  }

  const bool has_residual = residual.defined();
  if (has_residual && residual.shape() != x.shape())
    throw std::invalid_argument("batch_norm: residual has shape " + shape_str(residual.shape()) +
                                ", input has " + shape_str(x.shape()));
  Tensor y =
      k.bn_apply(xd, mean, invstd, wd, bd, BnEpilogue{has_residual ? residual.data() : Tensor(), relu});
  const bool has_weight = wd.defined(), has_bias = bd.defined(), x_needs_grad = x.requires_grad();
  std::vector<Variable> inputs{x};
  if (has_weight) inputs.push_back(weight);
  if (has_bias) inputs.push_back(bias);
  if (has_residual) inputs.push_back(residual);
  // The backward from the gradient at the normalisation's output (`mask`: the ReLU's output, applied by
  // the batch-norm kernels as they read, or undefined when g is already masked).
  auto from_normalised = [xd, wd, bd, eps, mean, invstd, batch_stats, count, has_weight, has_bias,
                          x_needs_grad, has_residual, weight_dtype = has_weight ? wd.dtype() : xd.dtype(),
                          bias_dtype = has_bias ? bd.dtype() : xd.dtype()](const Tensor& g,
                                                                           const Tensor& mask) {
    Backend& k = backend_for(g);
    // One call where the backend has a faster backward for this input (train.cudnn_batchnorm).
    if (batch_stats && x_needs_grad && has_weight && has_bias)
      if (std::optional<BnGrads> fused = k.bn_backward_fused(g, xd, mean, invstd, wd, bd, mask, eps)) {
        std::vector<Tensor> grads{fused->grad_x, fused->grad_gamma.to(weight_dtype),
                                  fused->grad_beta.to(bias_dtype)};
        if (has_residual) grads.push_back(g);
        return grads;
      }
    Tensor sum_dy, sum_dy_xhat;
    if (has_weight || has_bias || (batch_stats && x_needs_grad))
      std::tie(sum_dy, sum_dy_xhat) = k.bn_backward_reduce(g, xd, mean, invstd, mask);
    std::vector<Tensor> grads;
    if (!x_needs_grad) {
      grads.emplace_back();
    } else if (batch_stats) {
      grads.push_back(k.bn_backward_input(g, xd, mean, invstd, wd, sum_dy, sum_dy_xhat, count, mask));
    } else {
      // Running statistics are constants: grad_x = dy * invstd * gamma.
      const Tensor zero = Tensor::zeros(mean.shape(), mean.dtype(), mean.device());
      grads.push_back(k.bn_apply(g, zero, invstd, wd, Tensor(), {}));
    }
    if (has_weight) grads.push_back(sum_dy_xhat.to(weight_dtype));
    if (has_bias) grads.push_back(sum_dy.to(bias_dtype));
    if (has_residual) grads.push_back(g);
    return grads;
  };
  // Through the ReLU (its output is positive exactly where it passed its input). The batch-norm
  // kernels apply the mask as they read; the masked gradient is made here only where it is needed as
  // a tensor: as the residual's gradient, or for evaluation mode's affine backward.
  const Tensor relu_out = relu ? y : Tensor();
  const bool mask_here = relu && (has_residual || !batch_stats);
  Variable out =
      record_op("batch_norm", y, inputs,
                [from_normalised, relu_out, mask_here](const Tensor& g_out) -> std::vector<Tensor> {
                  if (!mask_here) return from_normalised(g_out, relu_out);
                  return from_normalised(
                      backend_for(g_out).unary_backward(UnaryOp::relu, g_out, Tensor(), relu_out), Tensor());
                });
  // A residual block's output usually feeds two ops (the next block's convolution and its shortcut):
  // its gradient arrives in two parts, added in the same pass that applies the ReLU's mask.
  if (mask_here)
    set_backward_of_two(out, [from_normalised, relu_out](const Tensor& a, const Tensor& b) {
      return from_normalised(backend_for(a).relu_backward_of_sum(a, b, relu_out), Tensor());
    });
  return out;
}

}  // namespace trainer::F
