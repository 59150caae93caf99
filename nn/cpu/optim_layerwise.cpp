// The weight average's update (timm's ModelEmaV3) and the layer-wise adaptive optimizers (timm's Lamb
// and Lars) on the CPU: plain loops in the parameter's dtype, norms summed in double in element order
// (the same sums on every run), scalar rules from nn/optim/update_rules.h; gradient-norm clipping on
// the same sums.
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "nn/cpu/cpu_backend.h"
#include "nn/kernel_checks.h"
#include "nn/optim/update_rules.h"

namespace trainer {
namespace {

// As the CPU's sgd/adamw kernels: the state shares the parameter's layout; the gradient is copied into
// it when it differs.
Tensor grad_in_layout(const Tensor& param, const Tensor& grad, const char* op) {
  if (!param.is_contiguous(param.suggest_memory_format()))
    throw std::invalid_argument(std::string(op) + ": parameter " + param.str() + " must be contiguous");
  if (grad.shape() != param.shape() || grad.dtype() != param.dtype())
    throw std::invalid_argument(std::string(op) + ": gradient " + grad.str() + " does not match parameter " +
                                param.str());
  if (grad.strides() == param.strides() || param.numel() <= 1) return grad;
  return grad.contiguous(param.suggest_memory_format());
}

void check_slot(const Tensor& param, const Tensor& state, const char* op, const char* what) {
  if (!state.defined() || state.shape() != param.shape() || state.dtype() != param.dtype() ||
      (state.strides() != param.strides() && param.numel() > 1))
    throw std::invalid_argument(std::string(op) + ": " + what + " " + state.str() +
                                " must have the parameter's shape, dtype and layout " + param.str());
}

template <class T>
double squared_norm(const T* x, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return s;
}

// torch.lerp(self, end, weight)'s two-sided formula.
template <class T>
T lerp(T self, T end, T weight) {
  return weight < T(0.5) ? self + weight * (end - self) : end - (end - self) * (T(1) - weight);
}

// Lamb's update direction for one element from the new moments (before the trust ratio).
template <class T>
T lamb_direction(T m, T v, T w, T bc1, T bc2_sqrt, T eps, T wd) {
  T u = (m / bc1) / (std::sqrt(v) / bc2_sqrt + eps);
  if (wd != T(0)) u += wd * w;
  return u;
}

}  // namespace

void CpuBackend::ema_update(const std::vector<EmaPair>& pairs, Tensor& updates, const EmaParams& p) {
  check_ema_update(pairs, updates, Device::cpu());
  if ((p.skip_if && *p.skip_if != 0) || (p.gate && *p.gate == 0)) return;
  int64_t& count = *updates.data<int64_t>();
  const double decay = ema_decay(p.rule, (count + 1) * p.rule.every_steps);
  for (const EmaPair& pair : pairs) {
    Tensor& avg = *pair.average;
    const int64_t n = avg.numel();
    if (avg.dtype() == DType::i64 || pair.copy) {
      avg.copy_(*pair.value);
      continue;
    }
    TRAINER_DISPATCH_FLOAT(avg.dtype(), "ema_update", [&] {
      scalar_t* a = avg.data<scalar_t>();
      const scalar_t* v = pair.value->data<scalar_t>();
      const scalar_t weight = static_cast<scalar_t>(1.0 - decay);
      for (int64_t i = 0; i < n; ++i) a[i] = lerp(a[i], v[i], weight);
    });
  }
  ++count;
}

void CpuBackend::add_squared_norms(const std::vector<const Tensor*>& tensors, Tensor& out) {
  check_squared_norms(tensors, out, Device::cpu());
  double sum = 0.0;
  for (const Tensor* t : tensors) {
    const Tensor dense = t->contiguous(t->suggest_memory_format());
    TRAINER_DISPATCH_FLOAT(dense.dtype(), "add_squared_norms",
                           [&] { sum += squared_norm(dense.data<scalar_t>(), dense.numel()); });
  }
  *out.data<double>() += sum;
}

void CpuBackend::clip_by_total_norm(const std::vector<Tensor*>& tensors, double max_norm, Tensor& norm_out) {
  check_clip_by_total_norm(tensors, max_norm, norm_out, Device::cpu());
  double sum = 0.0;
  for (const Tensor* t : tensors)
    TRAINER_DISPATCH_FLOAT(t->dtype(), "clip_by_total_norm",
                           [&] { sum += squared_norm(t->data<scalar_t>(), t->numel()); });
  const double norm = std::sqrt(sum);
  *norm_out.data<double>() = norm;
  const double coef = max_norm / (norm + 1e-6);
  if (coef >= 1.0) return;  // NaN falls through and propagates, as torch's clamp(coef, max=1) does
  for (Tensor* t : tensors)
    TRAINER_DISPATCH_FLOAT(t->dtype(), "clip_by_total_norm", [&] {
      scalar_t* x = t->data<scalar_t>();
      const scalar_t c = static_cast<scalar_t>(coef);
      for (int64_t i = 0, n = t->numel(); i < n; ++i) x[i] *= c;
    });
}

void CpuBackend::lamb_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                           const LambParams& p) {
  if (p.device_scalars) throw std::invalid_argument("lamb_step: device scalars are for CUDA parameters");
  const Tensor g_in = grad_in_layout(param, grad, "lamb_step");
  check_slot(param, exp_avg, "lamb_step", "exp_avg");
  check_slot(param, exp_avg_sq, "lamb_step", "exp_avg_sq");
  if (p.skip_if && *p.skip_if != 0) return;  // the loss scaler found inf/NaN gradients
  const LambScalars s = lamb_scalars(p, p.applied_steps ? *p.applied_steps + 1 : p.step);
  const double clip = lamb_clip_divisor(p.max_grad_norm, p.grad_sq_norm);
  TRAINER_DISPATCH_FLOAT(param.dtype(), "lamb_step", [&] {
    using T = scalar_t;
    T* w = param.data<T>();
    const T* gp = g_in.data<T>();
    T* m = exp_avg.data<T>();
    T* v = exp_avg_sq.data<T>();
    const T w1 = static_cast<T>(1.0 - p.beta1), b2 = static_cast<T>(p.beta2),
            w2 = static_cast<T>(1.0 - p.beta2), eps = static_cast<T>(p.eps),
            wd = static_cast<T>(p.weight_decay), bc1 = static_cast<T>(s.bias_correction1),
            bc2 = static_cast<T>(s.bias_correction2_sqrt), divisor = static_cast<T>(clip);
    const int64_t n = param.numel();
    double w_sq = 0.0, u_sq = 0.0;
    for (int64_t i = 0; i < n; ++i) {  // the moments, and the norms of w and of the direction
      const T g = clip != 1.0 ? gp[i] / divisor : gp[i];
      m[i] = lerp(m[i], g, w1);
      v[i] = b2 * v[i] + w2 * g * g;
      const T u = lamb_direction(m[i], v[i], w[i], bc1, bc2, eps, wd);
      w_sq += static_cast<double>(w[i]) * static_cast<double>(w[i]);
      u_sq += static_cast<double>(u) * static_cast<double>(u);
    }
    const bool adapt = p.weight_decay != 0.0 || p.always_adapt;
    const T trust =
        static_cast<T>(adapt ? lamb_trust_ratio(std::sqrt(w_sq), std::sqrt(u_sq), p.trust_clip) : 1.0);
    const T neg_lr = static_cast<T>(-p.lr);
    for (int64_t i = 0; i < n; ++i) {
      const T u = lamb_direction(m[i], v[i], w[i], bc1, bc2, eps, wd);
      w[i] += neg_lr * (adapt ? u * trust : u);
    }
  });
}

void CpuBackend::lars_step(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, bool first_step,
                           const LarsParams& p) {
  if (p.device_scalars) throw std::invalid_argument("lars_step: device scalars are for CUDA parameters");
  const Tensor g_in = grad_in_layout(param, grad, "lars_step");
  const bool use_momentum = p.momentum != 0.0;
  if (use_momentum) check_slot(param, momentum_buffer, "lars_step", "momentum buffer");
  if (p.skip_if && *p.skip_if != 0) return;  // the loss scaler found inf/NaN gradients
  TRAINER_DISPATCH_FLOAT(param.dtype(), "lars_step", [&] {
    using T = scalar_t;
    T* w = param.data<T>();
    const T* gp = g_in.data<T>();
    T* buf = use_momentum ? momentum_buffer.data<T>() : nullptr;
    const int64_t n = param.numel();
    const bool adapt = p.weight_decay != 0.0 || p.always_adapt;
    const T trust = static_cast<T>(
        adapt ? lars_trust_ratio(std::sqrt(squared_norm(w, n)), std::sqrt(squared_norm(gp, n)), p, p.lr)
              : 1.0);
    const T wd = static_cast<T>(p.weight_decay), mom = static_cast<T>(p.momentum),
            keep = static_cast<T>(1.0 - p.dampening), neg_lr = static_cast<T>(-p.lr);
    for (int64_t i = 0; i < n; ++i) {
      T g = adapt ? (gp[i] + wd * w[i]) * trust : gp[i];
      if (buf) {
        buf[i] = first_step ? g : mom * buf[i] + keep * g;
        g = p.nesterov ? g + mom * buf[i] : buf[i];
      }
      w[i] += neg_lr * g;
    }
  });
}

}  // namespace trainer
