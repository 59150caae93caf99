// timm's Lamb and Lars on the GPU, one parameter per call like AdamW's kernel (optim.cu): a first
// kernel sums the norms the trust ratio needs (f64, one partial per block, added in a fixed order by a
// one-block kernel), a second applies the update with the ratio it reads from the device. The global
// gradient norm of Lamb's clipping is add_squared_norms' device sum (grad_norm.cu); the step's scalars
// come from the host, the device scalars of a captured step or the device count of applied updates, as
// AdamW's. f32 and f64, like the CPU.
#include <optional>

#include "nn/cuda/kernels.cuh"
#include "nn/kernel_checks.h"
#include "nn/optim/update_rules.h"

namespace trainer {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// The gradient in the parameter's layout (a copy only when the layouts differ), as optim.cu's.
Tensor grad_in_layout(const Tensor& param, const Tensor& grad, const char* op) {
  check_device(param, op, "parameter");
  check_device(grad, op, "gradient");
  if (!is_dense(param))
    throw std::invalid_argument(std::string(op) + ": parameter " + param.str() + " must be contiguous");
  if (grad.shape() != param.shape() || grad.dtype() != param.dtype())
    throw std::invalid_argument(std::string(op) + ": gradient " + grad.str() + " does not match parameter " +
                                param.str());
  if (same_layout(grad, param) || param.numel() <= 1) return grad;
  return grad.contiguous(dense_format(param));
}

void check_slot(const Tensor& param, const Tensor& state, const char* op, const char* what) {
  if (!state.defined() || state.device() != param.device() || state.shape() != param.shape() ||
      state.dtype() != param.dtype() || (!same_layout(state, param) && param.numel() > 1))
    throw std::invalid_argument(std::string(op) + ": " + what + " " + state.str() +
                                " must have the parameter's shape, dtype, device and layout " + param.str());
}

// This block's sums of v0 and v1 into partials[blockIdx.x] and partials[gridDim.x + blockIdx.x]; one
// block then adds them in index order (finish_norms_kernel), so the norms are the same bits on every
// run (an atomic add per block would depend on which block finished first).
__device__ __forceinline__ void block_partials(double v0, double v1, double* partials) {
  v0 = block_sum(v0);
  v1 = block_sum(v1);
  if (threadIdx.x == 0) partials[blockIdx.x] = v0, partials[gridDim.x + blockIdx.x] = v1;
}

// norms[k] = the sum of partials[k * blocks, (k + 1) * blocks), for k = 0, 1.
__global__ void finish_norms_kernel(const double* partials, int blocks, double* norms) {
  for (int k = 0; k < 2; ++k) {
    double s = 0.0;
    for (int i = threadIdx.x; i < blocks; i += blockDim.x) s += partials[k * blocks + i];
    s = block_sum(s);
    if (threadIdx.x == 0) norms[k] = s;
  }
}

// Scratch for a step's two norms: 2 partials per block of pass 1, then the two norms.
struct NormScratch {
  Tensor buffer;
  double *partials, *norms;
  int blocks;
  explicit NormScratch(int pass_blocks)
      : buffer(empty({2 * static_cast<int64_t>(pass_blocks) + 2}, DType::f64)),
        partials(static_cast<double*>(buffer.raw_data())),
        norms(partials + 2 * static_cast<int64_t>(pass_blocks)),
        blocks(pass_blocks) {}
  void finish() const {
    finish_norms_kernel<<<1, kThreads, 0, cuda_stream()>>>(partials, blocks, norms);
    CUDA_CHECK_LAUNCH();
  }
};

// A Lamb step's scalars, worked out by one thread per block (see adamw_kernel).
struct LambArgs {
  LambParams p;
  double host_bc1, host_bc2;
};
template <class T>
struct LambScalarsT {
  T lr, bc1, bc2, divisor;
  bool skip;
};
template <class T>
__device__ void lamb_block_scalars(const LambArgs& a, LambScalarsT<T>& s) {
  s.skip = a.p.skip_if && *a.p.skip_if != 0;
  const double* ds = a.p.device_scalars;
  double lr = ds ? ds[0] : a.p.lr, bc1 = ds ? ds[1] : a.host_bc1, bc2 = ds ? ds[2] : a.host_bc2;
  if (a.p.applied_steps) {  // lamb_scalars() of the updates applied, skipped steps left out
    const double t = static_cast<double>(*a.p.applied_steps) + 1.0;
    bc1 = __dsub_rn(1.0, pow(a.p.beta1, t));
    bc2 = sqrt(__dsub_rn(1.0, pow(a.p.beta2, t)));
  }
  s.lr = static_cast<T>(lr);
  s.bc1 = static_cast<T>(bc1);
  s.bc2 = static_cast<T>(bc2);
  s.divisor = static_cast<T>(lamb_clip_divisor(a.p.max_grad_norm, a.p.grad_sq_norm));
}

template <class T>
__device__ __forceinline__ T lamb_direction(T m, T v, T w, T bc1, T bc2, T eps, T wd) {
  T u = (m / bc1) / (sqrt(v) / bc2 + eps);
  if (wd != T(0)) u += wd * w;
  return u;
}

// Pass 1: the moments, and the squared norms of w and of the update direction as block partials.
template <class T>
__global__ void lamb_moments_kernel(const T* w, const T* gp, T* m, T* v, int64_t n, LambArgs a,
                                    double* partials) {
  __shared__ LambScalarsT<T> s;
  if (threadIdx.x == 0) lamb_block_scalars(a, s);
  __syncthreads();
  if (s.skip) return;
  const T w1 = static_cast<T>(1.0 - a.p.beta1), b2 = static_cast<T>(a.p.beta2),
          w2 = static_cast<T>(1.0 - a.p.beta2), eps = static_cast<T>(a.p.eps),
          wd = static_cast<T>(a.p.weight_decay);
  double w_sq = 0.0, u_sq = 0.0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const T g = s.divisor != T(1) ? gp[i] / s.divisor : gp[i];
    const T diff = g - m[i];  // exp_avg.lerp_(grad, 1 - beta1)
    m[i] = w1 < T(0.5) ? m[i] + w1 * diff : g - diff * (T(1) - w1);
    v[i] = b2 * v[i] + w2 * g * g;
    const T u = lamb_direction(m[i], v[i], w[i], s.bc1, s.bc2, eps, wd);
    w_sq += static_cast<double>(w[i]) * static_cast<double>(w[i]);
    u_sq += static_cast<double>(u) * static_cast<double>(u);
  }
  block_partials(w_sq, u_sq, partials);
}

// Pass 2: w -= lr * trust * u, the trust ratio from pass 1's norms.
template <class T>
__global__ void lamb_apply_kernel(T* w, const T* m, const T* v, int64_t n, LambArgs a, const double* norms) {
  __shared__ LambScalarsT<T> s;
  __shared__ T s_trust;
  const bool adapt = a.p.weight_decay != 0.0 || a.p.always_adapt;
  if (threadIdx.x == 0) {
    lamb_block_scalars(a, s);
    s_trust = static_cast<T>(adapt ? lamb_trust_ratio(sqrt(norms[0]), sqrt(norms[1]), a.p.trust_clip) : 1.0);
  }
  __syncthreads();
  if (s.skip) return;
  const T eps = static_cast<T>(a.p.eps), wd = static_cast<T>(a.p.weight_decay), neg_lr = -s.lr;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const T u = lamb_direction(m[i], v[i], w[i], s.bc1, s.bc2, eps, wd);
    w[i] += neg_lr * (adapt ? u * s_trust : u);
  }
}

template <class T>
__global__ void lars_norms_kernel(const T* w, const T* g, int64_t n, const int64_t* skip, double* partials) {
  if (skip && *skip != 0) return;
  double w_sq = 0.0, g_sq = 0.0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    w_sq += static_cast<double>(w[i]) * static_cast<double>(w[i]);
    g_sq += static_cast<double>(g[i]) * static_cast<double>(g[i]);
  }
  block_partials(w_sq, g_sq, partials);
}

// timm's Lars after the norms: the adapted gradient (g + wd * w) * trust, then SGD's momentum.
template <class T>
__global__ void lars_apply_kernel(T* w, const T* gp, T* buf, int64_t n, bool first, LarsParams p,
                                  const double* norms) {
  __shared__ T s_trust, s_lr;
  __shared__ bool s_skip;
  const bool adapt = p.weight_decay != 0.0 || p.always_adapt;
  if (threadIdx.x == 0) {
    s_skip = p.skip_if && *p.skip_if != 0;
    const double lr = p.device_scalars ? p.device_scalars[0] : p.lr;
    s_lr = static_cast<T>(lr);
    s_trust =
        static_cast<T>(adapt && !s_skip ? lars_trust_ratio(sqrt(norms[0]), sqrt(norms[1]), p, lr) : 1.0);
  }
  __syncthreads();
  if (s_skip) return;
  const T wd = static_cast<T>(p.weight_decay), mom = static_cast<T>(p.momentum),
          keep = static_cast<T>(1.0 - p.dampening), neg_lr = -s_lr, trust = s_trust;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    T g = adapt ? (gp[i] + wd * w[i]) * trust : gp[i];
    if (buf) {
      buf[i] = first ? g : mom * buf[i] + keep * g;
      g = p.nesterov ? g + mom * buf[i] : buf[i];
    }
    w[i] += neg_lr * g;
  }
}

}  // namespace
}  // namespace cuda

void CudaBackend::lamb_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                            const LambParams& p) {
  using namespace cuda;
  const Tensor g_in = grad_in_layout(param, grad, "lamb_step");
  check_slot(param, exp_avg, "lamb_step", "exp_avg");
  check_slot(param, exp_avg_sq, "lamb_step", "exp_avg_sq");
  const LambScalars scalars = lamb_scalars(p, p.step);  // throws unless p.step >= 1
  const int64_t n = param.numel();
  if (n == 0) return;
  LambArgs a{p, scalars.bias_correction1, scalars.bias_correction2_sqrt};
  const int blocks = static_cast<int>(grid_size(n, kThreads));
  const NormScratch scratch(blocks);
  CUDA_DISPATCH_F32_F64(param.dtype(), "lamb_step", [&] {
    using T = scalar_t;
    T* w = static_cast<T*>(param.raw_data());
    T* m = static_cast<T*>(exp_avg.raw_data());
    T* v = static_cast<T*>(exp_avg_sq.raw_data());
    lamb_moments_kernel<T><<<blocks, kThreads, 0, cuda_stream()>>>(w, static_cast<const T*>(g_in.raw_data()),
                                                                   m, v, n, a, scratch.partials);
    CUDA_CHECK_LAUNCH();
    scratch.finish();
    lamb_apply_kernel<T><<<blocks, kThreads, 0, cuda_stream()>>>(w, m, v, n, a, scratch.norms);
    CUDA_CHECK_LAUNCH();
  });
}

void CudaBackend::lars_step(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, bool first_step,
                            const LarsParams& p) {
  using namespace cuda;
  const Tensor g_in = grad_in_layout(param, grad, "lars_step");
  const bool use_momentum = p.momentum != 0.0;
  if (use_momentum) check_slot(param, momentum_buffer, "lars_step", "momentum buffer");
  const int64_t n = param.numel();
  if (n == 0) return;
  const bool adapt = p.weight_decay != 0.0 || p.always_adapt;
  const int blocks = static_cast<int>(grid_size(n, kThreads));
  const std::optional<NormScratch> scratch = adapt ? std::optional<NormScratch>(blocks) : std::nullopt;
  const double* nd = adapt ? scratch->norms : nullptr;
  CUDA_DISPATCH_F32_F64(param.dtype(), "lars_step", [&] {
    using T = scalar_t;
    T* w = static_cast<T*>(param.raw_data());
    const T* g = static_cast<const T*>(g_in.raw_data());
    if (adapt) {
      lars_norms_kernel<T><<<blocks, kThreads, 0, cuda_stream()>>>(w, g, n, p.skip_if, scratch->partials);
      CUDA_CHECK_LAUNCH();
      scratch->finish();
    }
    T* buf = use_momentum ? static_cast<T*>(momentum_buffer.raw_data()) : nullptr;
    lars_apply_kernel<T><<<blocks, kThreads, 0, cuda_stream()>>>(w, g, buf, n, first_step, p, nd);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace trainer
