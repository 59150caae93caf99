// Batch norm in its pieces (statistics with running averages, apply with the residual + ReLU epilogue,
// the two backward reductions), the fused forward and backward (or the pieces where a backend has no
// fused kernel, as the caller does), and SyncBatchNorm's three kernels at world size 1.
#include "op_case.h"

namespace trainer::op_cases {
namespace {

constexpr double kEps = 1e-5, kMomentum = 0.1;
const Shape kX = {4, 8, 5, 3};  // [N, C, H, W]
constexpr int64_t kC = 8, kCount = 4 * 5 * 3;

// Running statistics as the model keeps them: f32 beside half inputs, the input's dtype otherwise.
std::pair<Tensor, Tensor> running_stats(const Tensor& x) {
  const DType d = accumulate_dtype(x.dtype());
  Tensor mean = Tensor::full({kC}, 0.25, d, x.device()), var = Tensor::full({kC}, 2.0, d, x.device());
  return {mean, var};
}

// y = act(bn(x) * gamma + beta + residual), training mode; in: x, gamma, beta[, residual].
Tensors bn_forward(Backend& b, Tensors& in, bool epilogue) {
  auto [running_mean, running_var] = running_stats(in[0]);
  const auto [mean, invstd] = b.bn_train_stats(in[0], kEps, kMomentum, running_mean, running_var);
  BnEpilogue e;
  if (epilogue) e.residual = in[3], e.relu = true;
  return {b.bn_apply(in[0], mean, invstd, in[1], in[2], e), mean, invstd, running_mean, running_var};
}

Tensors bn_gradient(Backend& b, Tensors& in, const Tensor& g, bool epilogue) {
  const Tensors f = bn_forward(b, in, epilogue);
  const Tensor relu_out = epilogue ? f[0] : Tensor();
  const auto [sum_dy, sum_dy_xhat] = b.bn_backward_reduce(g, in[0], f[1], f[2], relu_out);
  Tensors grads{b.bn_backward_input(g, in[0], f[1], f[2], in[1], sum_dy, sum_dy_xhat, kCount, relu_out),
                sum_dy_xhat.to(in[1].dtype()), sum_dy.to(in[2].dtype())};
  if (epilogue) grads.push_back(b.unary_backward(UnaryOp::relu, g, f[0], f[0]));
  return grads;
}

OpCase bn_case(bool epilogue) {
  OpCase c;
  c.name = std::string("batch norm: bn_train_stats, bn_apply, bn_backward_reduce, bn_backward_input") +
           (epilogue ? ", residual + ReLU epilogue" : "");
  c.inputs = {image(kX, InputSpec::Values::uniform), uniform({kC}, 0.5, 1.5), uniform({kC})};
  c.inputs[0].lo = -2.0, c.inputs[0].hi = 3.0;
  if (epilogue) c.inputs.push_back(image(kX));
  c.inputs.push_back(image(kX));  // dy: the backward pieces run on it for the device comparison
  c.run = [epilogue](Backend& b, Tensors& in) {
    Tensors out = bn_forward(b, in, epilogue);
    for (Tensor& g : bn_gradient(b, in, in.back(), epilogue)) out.push_back(g);
    return out;
  };
  c.gradient = [epilogue](Backend& b, Tensors& in, const Tensor& g) {
    return bn_gradient(b, in, g, epilogue);
  };
  c.differentiable = epilogue ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{0, 1, 2};
  c.device_dtypes = {DType::f32, DType::bf16};
  c.channels_last = true;
  c.rtol_f32 = 2e-5;
  return c;
}

}  // namespace

std::vector<OpCase> batch_norm_cases() {
  std::vector<OpCase> cases;
  {
    OpCase c;
    c.name = "bn_mean_var";
    c.inputs = {image(kX)};
    c.inputs[0].lo = 3.0, c.inputs[0].hi = 5.0;  // |mean| above the spread
    c.run = [](Backend& b, Tensors& in) {
      const auto [mean, var] = b.bn_mean_var(in[0]);
      return Tensors{mean, var};
    };
    c.device_dtypes = {DType::f32, DType::bf16};
    c.channels_last = true;
    cases.push_back(c);
  }
  cases.push_back(bn_case(false));
  cases.push_back(bn_case(true));
  {
    // The fused kernels where the backend has them for this input; the pieces otherwise.
    OpCase c;
    c.name = "bn_forward_fused and bn_backward_fused (or the pieces)";
    c.inputs = {image(kX), uniform({kC}, 0.5, 1.5), uniform({kC}), image(kX),
                image(kX)};  // x, gamma, beta, residual, dy
    auto forward = [](Backend& b, Tensors& in) {
      auto [running_mean, running_var] = running_stats(in[0]);
      BnEpilogue e;
      e.residual = in[3], e.relu = true;
      if (auto f = b.bn_forward_fused(in[0], in[1], in[2], running_mean, running_var, kMomentum, kEps, e))
        return Tensors{f->y, f->mean, f->invstd, running_mean, running_var};
      const auto [mean, invstd] = b.bn_train_stats(in[0], kEps, kMomentum, running_mean, running_var);
      return Tensors{b.bn_apply(in[0], mean, invstd, in[1], in[2], e), mean, invstd, running_mean,
                     running_var};
    };
    auto backward = [forward](Backend& b, Tensors& in, const Tensor& g) {
      const Tensors f = forward(b, in);
      if (auto fused = b.bn_backward_fused(g, in[0], f[1], f[2], in[1], in[2], f[0], kEps))
        return Tensors{fused->grad_x, fused->grad_gamma.to(in[1].dtype()), fused->grad_beta.to(in[2].dtype()),
                       b.unary_backward(UnaryOp::relu, g, f[0], f[0])};
      const auto [sum_dy, sum_dy_xhat] = b.bn_backward_reduce(g, in[0], f[1], f[2], f[0]);
      return Tensors{b.bn_backward_input(g, in[0], f[1], f[2], in[1], sum_dy, sum_dy_xhat, kCount, f[0]),
                     sum_dy_xhat.to(in[1].dtype()), sum_dy.to(in[2].dtype()),
                     b.unary_backward(UnaryOp::relu, g, f[0], f[0])};
    };
    c.run = [forward, backward](Backend& b, Tensors& in) {
      Tensors out = forward(b, in);
      for (Tensor& g : backward(b, in, in[4])) out.push_back(g);
      return out;
    };
    c.gradient = backward;
    c.differentiable = {0, 1, 2, 3};
    c.device_dtypes = {DType::f32, DType::bf16};
    c.channels_last = true;
    c.rtol_f32 = 2e-5;
    cases.push_back(c);
  }
  {
    // SyncBatchNorm's kernels at world size 1 (no all-reduce between them): the same function and
    // gradient as batch norm, with the statistics in the packed f64 buffers.
    OpCase c;
    c.name = "sync_bn_local_stats, sync_bn_global_stats, sync_bn_local_grad_sums";
    c.inputs = {image(kX), uniform({kC}, 0.5, 1.5), uniform({kC}), image(kX)};  // x, gamma, beta, dy
    auto forward = [](Backend& b, Tensors& in) {
      Tensor packed = Tensor::empty({2 * kC + 1}, DType::f64, in[0].device());
      b.sync_bn_local_stats(in[0], packed);
      auto [running_mean, running_var] = running_stats(in[0]);
      const auto [mean, invstd] = b.sync_bn_global_stats(packed, accumulate_dtype(in[0].dtype()), kEps,
                                                         kMomentum, running_mean, running_var);
      return Tensors{
          b.bn_apply(in[0], mean, invstd, in[1], in[2], {}), mean, invstd, packed, running_mean, running_var};
    };
    auto backward = [forward](Backend& b, Tensors& in, const Tensor& g) {
      const Tensors f = forward(b, in);
      Tensor means = Tensor::empty({2 * kC}, DType::f64, in[0].device());
      const auto [sum_dy, sum_dy_xhat] = b.sync_bn_local_grad_sums(g, in[0], f[1], f[2], f[3], means);
      return Tensors{b.bn_backward_input(g, in[0], f[1], f[2], in[1], means.slice(0, 0, kC),
                                         means.slice(0, kC, 2 * kC), 1, Tensor()),
                     sum_dy_xhat.to(in[1].dtype()), sum_dy.to(in[2].dtype())};
    };
    c.run = [forward, backward](Backend& b, Tensors& in) {
      Tensors out = forward(b, in);
      for (Tensor& g : backward(b, in, in[3])) out.push_back(g);
      return out;
    };
    c.gradient = backward;
    c.differentiable = {0, 1, 2};
    c.device_dtypes = {DType::f32, DType::bf16};
    c.channels_last = true;
    c.rtol_f32 = 2e-5;
    cases.push_back(c);
  }
  return cases;
}

}  // namespace trainer::op_cases
