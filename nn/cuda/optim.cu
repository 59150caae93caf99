// Optimizer updates (SGD with momentum/dampening/Nesterov and coupled weight decay; AdamW with
// decoupled weight decay), in place, with the CPU backend's (torch.optim's) update rules and order of
// operations per element. f32 and f64, like the CPU.
#include <cmath>

#include "nn/cuda/kernels.cuh"
#include "nn/cuda/multi_tensor.cuh"
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

namespace cuda {
namespace {

// Up to kSgdTensors parameters per launch, passed by value in the kernel's arguments (no device table
// to fill: in a CUDA graph the arguments are the captured addresses, which replays keep). Each block
// updates one chunk of one tensor; chunk_start[t] is tensor t's first chunk.
constexpr int kSgdTensors = 48;
constexpr int64_t kSgdChunk = 16384;  // elements per block
template <class T>
struct SgdLaunch {
  int tensors = 0;
  T* w[kSgdTensors];
  const T* g[kSgdTensors];
  T* buf[kSgdTensors];  // null without momentum
  int64_t numel[kSgdTensors];
  bool first[kSgdTensors];
  int chunk_start[kSgdTensors + 1];
  bool aligned = true;  // every pointer 16-byte aligned
};

// torch.optim.SGD's update of one element, in its order of operations.
template <class T>
__device__ __forceinline__ void sgd_element(T& w, T g, T* buf, bool first, T lr, T wd, T mom, T keep,
                                            bool decay, bool nesterov) {
  if (decay) g += wd * w;
  if (buf) {
    *buf = first ? g : mom * *buf + keep * g;
    g = nesterov ? g + mom * *buf : *buf;
  }
  w -= lr * g;
}

// 16 bytes of every operand per thread and iteration (the caching allocator's blocks, hence every
// parameter, gradient and buffer, are 256-byte aligned; vec says so for the whole launch): with one
// element at a time the kernel ran at half the memory's speed. The arithmetic per element is the same.
template <class T>
__global__ void sgd_many_kernel(SgdLaunch<T> l, T host_lr, const double* device_lr, const int64_t* skip_if,
                                T wd, T mom, T keep, bool decay, bool nesterov, bool vec) {
  if (skip_if && *skip_if != 0) return;  // the loss scaler found inf/NaN gradients
  const auto [t, begin, end] = block_chunk(l, kSgdChunk);
  const T lr = device_lr ? static_cast<T>(*device_lr) : host_lr;
  T* w = l.w[t];
  const T* gp = l.g[t];
  T* buf = l.buf[t];
  const bool first = l.first[t];
  int64_t done = begin;
  if (vec) {
    using P = Pack16<T>;
    constexpr int V = P::kSize;  // kSgdChunk is a multiple of V: packs never straddle chunks
    const int64_t packs = (end - begin) / V;
    for (int64_t q = threadIdx.x; q < packs; q += blockDim.x) {
      const int64_t i = begin + q * V;
      P wv = *reinterpret_cast<const P*>(w + i);
      const P gv = *reinterpret_cast<const P*>(gp + i);
      P bv;
      if (buf) bv = *reinterpret_cast<const P*>(buf + i);
#pragma unroll
      for (int j = 0; j < V; ++j)
        sgd_element(wv.v[j], gv.v[j], buf ? &bv.v[j] : nullptr, first, lr, wd, mom, keep, decay, nesterov);
      *reinterpret_cast<P*>(w + i) = wv;
      if (buf) *reinterpret_cast<P*>(buf + i) = bv;
    }
    done = begin + packs * V;
  }
  for (int64_t i = done + threadIdx.x; i < end; i += blockDim.x)
    sgd_element(w[i], gp[i], buf ? &buf[i] : nullptr, first, lr, wd, mom, keep, decay, nesterov);
}

template <class T>
void launch_sgd(SgdLaunch<T>& l, const SgdParams& p) {
  if (l.tensors == 0) return;
  const T lr = static_cast<T>(p.lr), wd = static_cast<T>(p.weight_decay), mom = static_cast<T>(p.momentum),
          keep = static_cast<T>(1.0 - p.dampening);
  sgd_many_kernel<T><<<l.chunk_start[l.tensors], 256, 0, cuda_stream()>>>(
      l, lr, p.device_scalars, p.skip_if, wd, mom, keep, p.weight_decay != 0.0, p.nesterov, l.aligned);
  CUDA_CHECK_LAUNCH();
  l.tensors = 0;
  l.chunk_start[0] = 0;
  l.aligned = true;
}

}  // namespace
}  // namespace cuda

void CudaBackend::sgd_step(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, bool first_step,
                           const SgdParams& p) {
  sgd_step_many({{&param, &grad, p.momentum != 0.0 ? &momentum_buffer : nullptr, first_step}}, p);
}

void CudaBackend::sgd_step_many(const std::vector<SgdUpdate>& updates, const SgdParams& p) {
  using namespace cuda;
  if (updates.empty()) return;
  const DType dtype = updates[0].param->dtype();
  const bool use_momentum = p.momentum != 0.0;
  // Gradients in another layout than their parameter are copied; they must live until the launch.
  std::vector<Tensor> gradients;
  gradients.reserve(updates.size());
  for (const SgdUpdate& u : updates) {
    Tensor& param = *u.param;
    check_device(param, "sgd_step", "parameter");
    if (param.dtype() != dtype)
      throw std::invalid_argument("sgd_step: parameters of one launch must share a dtype, got " +
                                  param.str() + " and " + updates[0].param->str());
    gradients.push_back(grad_like(param, *u.grad, param_format(param, "sgd_step"), "sgd_step"));
    if (use_momentum) {
      if (!u.momentum_buffer) throw std::invalid_argument("sgd_step: momentum needs a momentum buffer");
      check_state(param, *u.momentum_buffer, "sgd_step", "momentum buffer");
    }
  }
  CUDA_DISPATCH_F32_F64(dtype, "sgd_step", [&] {
    SgdLaunch<scalar_t> l;
    l.chunk_start[0] = 0;
    for (size_t i = 0; i < updates.size(); ++i) {
      const int64_t n = updates[i].param->numel();
      if (n == 0) continue;
      const int k = l.tensors++;
      l.w[k] = static_cast<scalar_t*>(updates[i].param->raw_data());
      l.g[k] = static_cast<const scalar_t*>(gradients[i].raw_data());
      l.buf[k] = use_momentum ? static_cast<scalar_t*>(updates[i].momentum_buffer->raw_data()) : nullptr;
      l.numel[k] = n;
      l.first[k] = updates[i].first_step;
      l.aligned = l.aligned && aligned16(l.w[k]) && aligned16(l.g[k]) && (!l.buf[k] || aligned16(l.buf[k]));
      l.chunk_start[k + 1] = l.chunk_start[k] + static_cast<int>((n + kSgdChunk - 1) / kSgdChunk);
      if (l.tensors == kSgdTensors) launch_sgd(l, p);
    }
    launch_sgd(l, p);
  });
}

namespace cuda {
namespace {

// What the AdamW kernel needs besides the tensors: the group's values, and per tensor where its step's
// factors come from -- the host (lr, step), the device scalars (a replayed step), or, for the bias
// correction, the device count of applied updates (a device loss scaler may skip steps).
template <class T>
struct AdamWArgs {
  T w1, b2, w2, eps, host_decay;
  bool lerp_low, apply_decay;
  double weight_decay, beta1, beta2, host_lr;
  const int64_t* skip;  // found-inf flag or null
};

// Up to kAdamWTensors parameters per launch, passed by value as in SgdLaunch (under the 4 KiB of
// kernel arguments in f64 too); each block updates one chunk of one tensor.
constexpr int kAdamWTensors = 36;
constexpr int64_t kAdamWChunk = 16384;  // elements per block
template <class T>
struct AdamWLaunch {
  int tensors = 0;
  T* w[kAdamWTensors];
  const T* g[kAdamWTensors];
  T* m[kAdamWTensors];
  T* v[kAdamWTensors];
  int64_t numel[kAdamWTensors];
  const double* ds[kAdamWTensors];        // [lr, step_size, bias_correction2_sqrt] or null
  const int64_t* applied[kAdamWTensors];  // updates applied so far, or null
  T host_bc2[kAdamWTensors], host_neg_step[kAdamWTensors];
  int chunk_start[kAdamWTensors + 1];
  bool aligned = true;  // every pointer 16-byte aligned
};

// torch.optim.AdamW's update of one element, in its order of operations.
template <class T>
__device__ __forceinline__ void adamw_element(T& w, T g, T& m, T& v, const AdamWArgs<T>& a, T decay, T bc2,
                                              T neg_step) {
  if (a.apply_decay) w *= decay;
  // exp_avg.lerp_(grad, 1 - beta1), with torch's two-sided lerp formula.
  const T diff = g - m;
  m = a.lerp_low ? m + a.w1 * diff : g - diff * (T(1) - a.w1);
  v = a.b2 * v + a.w2 * g * g;
  const T denom = sqrt(v) / bc2 + a.eps;
  w += neg_step * (m / denom);
}

template <class T>
__global__ void adamw_many_kernel(AdamWLaunch<T> l, AdamWArgs<T> a, bool vec) {
  const auto [t, begin, end] = block_chunk(l, kAdamWChunk);
  // One thread per block works out the step's factors: in every thread, the bias correction's double
  // pow() would cost milliseconds per step on GPUs whose double precision is slow.
  __shared__ T s_decay, s_bc2, s_neg_step;
  __shared__ bool s_skip;
  if (threadIdx.x == 0) {
    s_skip = a.skip && *a.skip != 0;  // the loss scaler found inf/NaN gradients
    const double* ds = l.ds[t];
    // The host's double arithmetic exactly (no fused multiply-add), so replays equal eager steps.
    const double lr = ds ? ds[0] : a.host_lr;
    s_decay = ds ? static_cast<T>(__dsub_rn(1.0, __dmul_rn(lr, a.weight_decay))) : a.host_decay;
    s_bc2 = ds ? static_cast<T>(ds[2]) : l.host_bc2[t];
    s_neg_step = ds ? static_cast<T>(-ds[1]) : l.host_neg_step[t];
    if (const int64_t* applied = l.applied[t]) {  // adamw_scalars() of the updates applied, skips left out
      const double steps = static_cast<double>(*applied) + 1.0;
      s_bc2 = static_cast<T>(sqrt(__dsub_rn(1.0, pow(a.beta2, steps))));
      s_neg_step = static_cast<T>(-__ddiv_rn(lr, __dsub_rn(1.0, pow(a.beta1, steps))));
    }
  }
  __syncthreads();
  if (s_skip) return;
  const T decay = s_decay, bc2 = s_bc2, neg_step = s_neg_step;
  T *w = l.w[t], *m = l.m[t], *v = l.v[t];
  const T* gp = l.g[t];
  int64_t done = begin;
  if (vec) {
    using P = Pack16<T>;
    constexpr int V = P::kSize;  // kAdamWChunk is a multiple of V: packs never straddle chunks
    const int64_t packs = (end - begin) / V;
    for (int64_t q = threadIdx.x; q < packs; q += blockDim.x) {
      const int64_t i = begin + q * V;
      P wv = *reinterpret_cast<const P*>(w + i), mv = *reinterpret_cast<const P*>(m + i),
        vv = *reinterpret_cast<const P*>(v + i);
      const P gv = *reinterpret_cast<const P*>(gp + i);
#pragma unroll
      for (int j = 0; j < V; ++j) adamw_element(wv.v[j], gv.v[j], mv.v[j], vv.v[j], a, decay, bc2, neg_step);
      *reinterpret_cast<P*>(w + i) = wv;
      *reinterpret_cast<P*>(m + i) = mv;
      *reinterpret_cast<P*>(v + i) = vv;
    }
    done = begin + packs * V;
  }
  for (int64_t i = done + threadIdx.x; i < end; i += blockDim.x)
    adamw_element(w[i], gp[i], m[i], v[i], a, decay, bc2, neg_step);
}

template <class T>
void launch_adamw(AdamWLaunch<T>& l, const AdamWArgs<T>& a) {
  if (l.tensors == 0) return;
  adamw_many_kernel<T><<<l.chunk_start[l.tensors], 256, 0, cuda_stream()>>>(l, a, l.aligned);
  CUDA_CHECK_LAUNCH();
  l.tensors = 0;
  l.chunk_start[0] = 0;
  l.aligned = true;
}

}  // namespace
}  // namespace cuda

void CudaBackend::adamw_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                             const AdamWParams& p) {
  adamw_step_many({{&param, &grad, &exp_avg, &exp_avg_sq, p.step, p.device_scalars, p.applied_steps}}, p);
}

void CudaBackend::adamw_step_many(const std::vector<AdamWUpdate>& updates, const AdamWParams& p) {
  using namespace cuda;
  if (updates.empty()) return;
  const DType dtype = updates[0].param->dtype();
  // Gradients in another layout than their parameter are copied; they must live until the launch.
  std::vector<Tensor> gradients;
  std::vector<AdamWScalars> scalars;
  gradients.reserve(updates.size());
  scalars.reserve(updates.size());
  for (const AdamWUpdate& u : updates) {
    Tensor& param = *u.param;
    check_device(param, "adamw_step", "parameter");
    if (param.dtype() != dtype)
      throw std::invalid_argument("adamw_step: parameters of one launch must share a dtype, got " +
                                  param.str() + " and " + updates[0].param->str());
    gradients.push_back(grad_like(param, *u.grad, param_format(param, "adamw_step"), "adamw_step"));
    check_state(param, *u.exp_avg, "adamw_step", "exp_avg");
    check_state(param, *u.exp_avg_sq, "adamw_step", "exp_avg_sq");
    AdamWParams each = p;
    each.step = u.step;
    scalars.push_back(adamw_scalars(each));  // throws unless the step is >= 1
  }
  CUDA_DISPATCH_F32_F64(dtype, "adamw_step", [&] {
    AdamWArgs<scalar_t> a;
    a.w1 = static_cast<scalar_t>(1.0 - p.beta1);
    a.b2 = static_cast<scalar_t>(p.beta2);
    a.w2 = static_cast<scalar_t>(1.0 - p.beta2);
    a.eps = static_cast<scalar_t>(p.eps);
    a.host_decay = static_cast<scalar_t>(1.0 - p.lr * p.weight_decay);
    a.lerp_low = (1.0 - p.beta1) < 0.5;
    a.apply_decay = p.weight_decay != 0.0;
    a.weight_decay = p.weight_decay;
    a.beta1 = p.beta1;
    a.beta2 = p.beta2;
    a.host_lr = p.lr;
    a.skip = p.skip_if;
    AdamWLaunch<scalar_t> l;
    l.chunk_start[0] = 0;
    for (size_t i = 0; i < updates.size(); ++i) {
      const AdamWUpdate& u = updates[i];
      const int64_t n = u.param->numel();
      if (n == 0) continue;
      const int k = l.tensors++;
      l.w[k] = static_cast<scalar_t*>(u.param->raw_data());
      l.g[k] = static_cast<const scalar_t*>(gradients[i].raw_data());
      l.m[k] = static_cast<scalar_t*>(u.exp_avg->raw_data());
      l.v[k] = static_cast<scalar_t*>(u.exp_avg_sq->raw_data());
      l.numel[k] = n;
      l.ds[k] = u.device_scalars;
      l.applied[k] = u.applied_steps;
      l.host_bc2[k] = static_cast<scalar_t>(scalars[i].bias_correction2_sqrt);
      l.host_neg_step[k] = static_cast<scalar_t>(-scalars[i].step_size);
      l.aligned =
          l.aligned && aligned16(l.w[k]) && aligned16(l.g[k]) && aligned16(l.m[k]) && aligned16(l.v[k]);
      l.chunk_start[k + 1] = l.chunk_start[k] + static_cast<int>((n + kAdamWChunk - 1) / kAdamWChunk);
      if (l.tensors == kAdamWTensors) launch_adamw(l, a);
    }
    launch_adamw(l, a);
  });
}

namespace cuda {
namespace {

// Up to kCountRows rows per launch, in the kernel's arguments (a CUDA graph keeps them).
constexpr int kCountRows = 256;
struct CountRows {
  int n = 0;
  int64_t rows[kCountRows];
};

__global__ void count_updates_kernel(int64_t* counts, CountRows r, const int64_t* skip_if) {
  if (skip_if && *skip_if != 0) return;  // the step was skipped: no update was applied
  for (int i = threadIdx.x; i < r.n; i += blockDim.x) ++counts[r.rows[i]];
}

}  // namespace
}  // namespace cuda

void CudaBackend::count_updates(Tensor& counts, const std::vector<int64_t>& rows, const int64_t* skip_if) {
  using namespace cuda;
  check_device(counts, "count_updates", "counts");
  check_update_counts(counts, rows);
  CountRows r;
  auto launch = [&] {
    if (r.n == 0) return;
    count_updates_kernel<<<1, 256, 0, cuda_stream()>>>(static_cast<int64_t*>(counts.raw_data()), r, skip_if);
    CUDA_CHECK_LAUNCH();
    r.n = 0;
  };
  for (int64_t row : rows) {
    r.rows[r.n++] = row;
    if (r.n == kCountRows) launch();
  }
  launch();
}

}  // namespace trainer
