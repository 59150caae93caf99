// Optimizer updates: SGD (momentum, dampening, Nesterov, coupled weight decay) and AdamW (decoupled
// weight decay), in place, with torch.optim's update rules and order of operations.
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "nn/cpu/cpu_backend.h"
#include "nn/cpu/parallel.h"
#include "nn/kernel_checks.h"

namespace trainer {
namespace {

// The layout every state tensor shares with the parameter. Any dense layout works: the update is
// elementwise, so only identical strides matter (channels_last convolution weights included).
MemoryFormat dense_format(const Tensor& t, const char* op) {
  if (t.is_contiguous()) return MemoryFormat::contiguous;
  if (t.is_contiguous(MemoryFormat::channels_last)) return MemoryFormat::channels_last;
  throw std::invalid_argument(std::string(op) + ": parameter " + t.str() + " must be contiguous");
}

// The gradient in the parameter's layout (a copy only when the layouts differ).
Tensor grad_like(const Tensor& param, const Tensor& grad, MemoryFormat format, const char* op) {
  if (grad.shape() != param.shape() || grad.dtype() != param.dtype())
    throw std::invalid_argument(std::string(op) + ": gradient " + grad.str() + " does not match parameter " +
                                param.str());
  if (grad.strides() == param.strides() || param.numel() <= 1) return grad;
  return grad.contiguous(format);
}

void check_state(const Tensor& param, const Tensor& state, const char* op, const char* what) {
  if (!state.defined() || state.shape() != param.shape() || state.dtype() != param.dtype() ||
      (state.strides() != param.strides() && param.numel() > 1))
    throw std::invalid_argument(std::string(op) + ": " + what + " " + state.str() +
                                " must have the parameter's shape, dtype and layout " + param.str());
}

}  // namespace

void CpuBackend::sgd_step(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, bool first_step,
                          const SgdParams& p) {
  if (p.device_scalars) throw std::invalid_argument("sgd_step: device scalars are for CUDA parameters");
  const MemoryFormat format = dense_format(param, "sgd_step");
  const Tensor g_in = grad_like(param, grad, format, "sgd_step");
  const bool use_momentum = p.momentum != 0.0;
  if (use_momentum) check_state(param, momentum_buffer, "sgd_step", "momentum buffer");
  if (p.skip_if && *p.skip_if != 0) return;  // the loss scaler found inf/NaN gradients
  TRAINER_DISPATCH_FLOAT(param.dtype(), "sgd_step", [&] {
    scalar_t* w = param.data<scalar_t>();
    const scalar_t* gp = g_in.data<scalar_t>();
    scalar_t* buf = use_momentum ? momentum_buffer.data<scalar_t>() : nullptr;
    const scalar_t lr = static_cast<scalar_t>(p.lr), wd = static_cast<scalar_t>(p.weight_decay),
                   mom = static_cast<scalar_t>(p.momentum), keep = static_cast<scalar_t>(1.0 - p.dampening);
    const int64_t n = param.numel();
    cpu::parallel_ranges(n, n, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        scalar_t g = gp[i];
        if (p.weight_decay != 0.0) g += wd * w[i];
        if (use_momentum) {
          buf[i] = first_step ? g : mom * buf[i] + keep * g;
          g = p.nesterov ? g + mom * buf[i] : buf[i];
        }
        w[i] -= lr * g;
      }
    });
  });
}

void CpuBackend::adamw_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                            const AdamWParams& p) {
  if (p.device_scalars) throw std::invalid_argument("adamw_step: device scalars are for CUDA parameters");
  const MemoryFormat format = dense_format(param, "adamw_step");
  const Tensor g_in = grad_like(param, grad, format, "adamw_step");
  check_state(param, exp_avg, "adamw_step", "exp_avg");
  check_state(param, exp_avg_sq, "adamw_step", "exp_avg_sq");
  if (p.skip_if && *p.skip_if != 0) return;  // the loss scaler found inf/NaN gradients
  AdamWParams counted = p;
  if (p.applied_steps) counted.step = *p.applied_steps + 1;
  const AdamWScalars scalars = adamw_scalars(counted);  // throws unless the step is >= 1
  TRAINER_DISPATCH_FLOAT(param.dtype(), "adamw_step", [&] {
    scalar_t* w = param.data<scalar_t>();
    const scalar_t* gp = g_in.data<scalar_t>();
    scalar_t* m = exp_avg.data<scalar_t>();
    scalar_t* v = exp_avg_sq.data<scalar_t>();
    const scalar_t decay = static_cast<scalar_t>(1.0 - p.lr * p.weight_decay);
    const scalar_t w1 = static_cast<scalar_t>(1.0 - p.beta1), b2 = static_cast<scalar_t>(p.beta2),
                   w2 = static_cast<scalar_t>(1.0 - p.beta2), eps = static_cast<scalar_t>(p.eps),
                   bc2 = static_cast<scalar_t>(scalars.bias_correction2_sqrt),
                   neg_step = static_cast<scalar_t>(-scalars.step_size);
    const bool lerp_low = (1.0 - p.beta1) < 0.5;
    const int64_t n = param.numel();
    cpu::parallel_ranges(n, n, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const scalar_t g = gp[i];
        if (p.weight_decay != 0.0) w[i] *= decay;
        // exp_avg.lerp_(grad, 1 - beta1), with torch's two-sided lerp formula.
        const scalar_t diff = g - m[i];
        m[i] = lerp_low ? m[i] + w1 * diff : g - diff * (scalar_t(1) - w1);
        v[i] = b2 * v[i] + w2 * g * g;
        const scalar_t denom = std::sqrt(v[i]) / bc2 + eps;
        w[i] += neg_step * (m[i] / denom);
      }
    });
  });
}

void CpuBackend::count_updates(Tensor& counts, const std::vector<int64_t>& rows, const int64_t* skip_if) {
  check_update_counts(counts, rows);
  if (skip_if && *skip_if != 0) return;
  int64_t* c = counts.data<int64_t>();
  for (int64_t r : rows) ++c[r];
}

}  // namespace trainer
