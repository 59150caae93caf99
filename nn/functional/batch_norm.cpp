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
                    Tensor& running_var, bool training, double momentum, double eps) {
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
    auto [batch_mean, batch_var] = k.bn_mean_var(xd);
    mean = batch_mean;
    invstd = inverse_std(batch_var, eps);
    if (training && running_mean.defined()) {
      // Like torch.nn.BatchNorm2d: normalise with the biased variance, track the unbiased one.
      const double n = static_cast<double>(count);
      update_running(running_mean, batch_mean, momentum, 1.0);
      update_running(running_var, batch_var, momentum, n / (n - 1.0));
    }
  } else {
    // Snapshots: a later training step updates the running tensors in place, and this graph's
    // backward must see the statistics its forward used.
    const DType stats = accumulate_dtype(xd.dtype());
    mean = running_mean.dtype() == stats ? running_mean.clone() : running_mean.to(stats);
    invstd = inverse_std(running_var, eps).to(stats);
  }

  Tensor y = k.bn_apply(xd, mean, invstd, wd, bd);
  const bool has_weight = wd.defined(), has_bias = bd.defined(), x_needs_grad = x.requires_grad();
  std::vector<Variable> inputs{x};
  if (has_weight) inputs.push_back(weight);
  if (has_bias) inputs.push_back(bias);
  return record_op(
      "batch_norm", y, inputs,
      [xd, wd, mean, invstd, batch_stats, count, has_weight, has_bias, x_needs_grad,
       weight_dtype = has_weight ? wd.dtype() : xd.dtype(),
       bias_dtype = has_bias ? bd.dtype() : xd.dtype()](const Tensor& g) -> std::vector<Tensor> {
        Backend& k = backend_for(g);
        Tensor sum_dy, sum_dy_xhat;
        if (has_weight || has_bias || (batch_stats && x_needs_grad))
          std::tie(sum_dy, sum_dy_xhat) = k.bn_backward_reduce(g, xd, mean, invstd);
        std::vector<Tensor> grads;
        if (!x_needs_grad) {
          grads.emplace_back();
        } else if (batch_stats) {
          grads.push_back(k.bn_backward_input(g, xd, mean, invstd, wd, sum_dy, sum_dy_xhat, count));
        } else {
          // Running statistics are constants: grad_x = dy * invstd * gamma.
          const Tensor zero = Tensor::zeros(mean.shape(), mean.dtype(), mean.device());
          grads.push_back(k.bn_apply(g, zero, invstd, wd, Tensor()));
        }
        if (has_weight) grads.push_back(sum_dy_xhat.to(weight_dtype));
        if (has_bias) grads.push_back(sum_dy.to(bias_dtype));
        return grads;
      });
}

}  // namespace trainer::F
