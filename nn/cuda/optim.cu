// Optimizer updates (SGD with momentum/dampening/Nesterov and coupled weight decay; AdamW with
// decoupled weight decay), in place, one thread per element, with the CPU backend's (torch.optim's)
// update rules and order of operations. f32 and f64, like the CPU.
#include <cmath>

#include "nn/cuda/kernels.cuh"
#include "nn/kernel_checks.h"

namespace trainer {
namespace cuda {
namespace {

MemoryFormat param_format(const Tensor& t, const char* op) {
  if (!is_dense(t))
    throw std::invalid_argument(std::string(op) + ": parameter " + t.str() + " must be contiguous");
  return dense_format(t);
}

// The gradient in the parameter's layout (a copy only when the layouts differ).
Tensor grad_like(const Tensor& param, const Tensor& grad, MemoryFormat format, const char* op) {
  check_device(grad, op, "gradient");
  if (grad.shape() != param.shape() || grad.dtype() != param.dtype())
    throw std::invalid_argument(std::string(op) + ": gradient " + grad.str() + " does not match parameter " +
                                param.str());
  if (same_layout(grad, param) || param.numel() <= 1) return grad;
  return grad.contiguous(format);
}

void check_state(const Tensor& param, const Tensor& state, const char* op, const char* what) {
  if (!state.defined() || state.device() != param.device() || state.shape() != param.shape() ||
      state.dtype() != param.dtype() || (!same_layout(state, param) && param.numel() > 1))
    throw std::invalid_argument(std::string(op) + ": " + what + " " + state.str() +
                                " must have the parameter's shape, dtype, device and layout " + param.str());
}

}  // namespace
}  // namespace cuda

void CudaBackend::sgd_step(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, bool first_step,
                           const SgdParams& p) {
  using namespace cuda;
  check_device(param, "sgd_step", "parameter");
  const MemoryFormat format = param_format(param, "sgd_step");
  const Tensor g_in = grad_like(param, grad, format, "sgd_step");
  const bool use_momentum = p.momentum != 0.0;
  if (use_momentum) check_state(param, momentum_buffer, "sgd_step", "momentum buffer");
  CUDA_DISPATCH_F32_F64(param.dtype(), "sgd_step", [&] {
    scalar_t* w = static_cast<scalar_t*>(param.raw_data());
    const scalar_t* gp = static_cast<const scalar_t*>(g_in.raw_data());
    scalar_t* buf = use_momentum ? static_cast<scalar_t*>(momentum_buffer.raw_data()) : nullptr;
    const scalar_t host_lr = static_cast<scalar_t>(p.lr), wd = static_cast<scalar_t>(p.weight_decay),
                   mom = static_cast<scalar_t>(p.momentum), keep = static_cast<scalar_t>(1.0 - p.dampening);
    const bool decay = p.weight_decay != 0.0, nesterov = p.nesterov;
    const double* device_lr = p.device_scalars;
    for_each(param.numel(), [=] __device__(int64_t i) {
      const scalar_t lr = device_lr ? static_cast<scalar_t>(*device_lr) : host_lr;
      scalar_t g = gp[i];
      if (decay) g += wd * w[i];
      if (buf) {
        buf[i] = first_step ? g : mom * buf[i] + keep * g;
        g = nesterov ? g + mom * buf[i] : buf[i];
      }
      w[i] -= lr * g;
    });
  });
}

void CudaBackend::adamw_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                             const AdamWParams& p) {
  using namespace cuda;
  check_device(param, "adamw_step", "parameter");
  const MemoryFormat format = param_format(param, "adamw_step");
  const Tensor g_in = grad_like(param, grad, format, "adamw_step");
  check_state(param, exp_avg, "adamw_step", "exp_avg");
  check_state(param, exp_avg_sq, "adamw_step", "exp_avg_sq");
  const AdamWScalars scalars = adamw_scalars(p);  // throws unless p.step >= 1
  CUDA_DISPATCH_F32_F64(param.dtype(), "adamw_step", [&] {
    scalar_t* w = static_cast<scalar_t*>(param.raw_data());
    const scalar_t* gp = static_cast<const scalar_t*>(g_in.raw_data());
    scalar_t* m = static_cast<scalar_t*>(exp_avg.raw_data());
    scalar_t* v = static_cast<scalar_t*>(exp_avg_sq.raw_data());
    const scalar_t host_decay = static_cast<scalar_t>(1.0 - p.lr * p.weight_decay);
    const scalar_t w1 = static_cast<scalar_t>(1.0 - p.beta1), b2 = static_cast<scalar_t>(p.beta2),
                   w2 = static_cast<scalar_t>(1.0 - p.beta2), eps = static_cast<scalar_t>(p.eps),
                   host_bc2 = static_cast<scalar_t>(scalars.bias_correction2_sqrt),
                   host_neg_step = static_cast<scalar_t>(-scalars.step_size);
    const bool lerp_low = (1.0 - p.beta1) < 0.5, apply_decay = p.weight_decay != 0.0;
    const double* ds = p.device_scalars;  // [lr, step_size, bias_correction2_sqrt]
    const double weight_decay = p.weight_decay;
    for_each(param.numel(), [=] __device__(int64_t i) {
      // The host's double arithmetic exactly (no fused multiply-add), so replays equal eager steps.
      const scalar_t decay =
          ds ? static_cast<scalar_t>(__dsub_rn(1.0, __dmul_rn(ds[0], weight_decay))) : host_decay;
      const scalar_t bc2 = ds ? static_cast<scalar_t>(ds[2]) : host_bc2;
      const scalar_t neg_step = ds ? static_cast<scalar_t>(-ds[1]) : host_neg_step;
      const scalar_t g = gp[i];
      if (apply_decay) w[i] *= decay;
      // exp_avg.lerp_(grad, 1 - beta1), with torch's two-sided lerp formula.
      const scalar_t diff = g - m[i];
      m[i] = lerp_low ? m[i] + w1 * diff : g - diff * (scalar_t(1) - w1);
      v[i] = b2 * v[i] + w2 * g * g;
      const scalar_t denom = sqrt(v[i]) / bc2 + eps;
      w[i] += neg_step * (m[i] / denom);
    });
  });
}

}  // namespace trainer
