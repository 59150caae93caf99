// Losses against soft targets on the GPU with the CPU backend's semantics (nn/cpu/soft_target_loss.cpp):
// cross-entropy via a fused log-softmax, one block per row with the row's sums in double, and binary
// cross-entropy with logits per element. Half logits compute in f32 (the functional layer casts them
// under autocast first); targets are read in the logits' dtype.
#include <vector>

#include "nn/cuda/kernels.cuh"
#include "nn/soft_target_checks.h"

namespace trainer {
namespace cuda {
namespace {

constexpr int kRowThreads = 128;

struct MaxOp {
  __device__ double operator()(double a, double b) const { return a > b ? a : b; }
};

// Checks and returns K; both tensors on this device.
int64_t device_soft_targets(const Tensor& logits, const Tensor& targets, const char* op) {
  check_device(logits, op, "logits");
  check_device(targets, op, "targets");
  return check_soft_targets(logits, targets, op);
}

Tensor device_weights(const Tensor& grad_loss, int64_t n, const char* op) {
  check_loss_weights(grad_loss, n, op);
  return grad_loss.to(current_device()).to(DType::f64).contiguous();
}

template <class T>
__global__ void soft_cross_entropy_kernel(const T* logits, const T* targets, int64_t K, T* loss, T* probs) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * K;
  const T* t = targets + row * K;
  double m = -INFINITY, nans = 0.0;
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
    const double v = to_acc(x[k]);
    if (isnan(v))
      nans += 1.0;
    else
      m = max(m, v);
  }
  m = block_reduce(m, MaxOp{}, -static_cast<double>(INFINITY));
  if (block_sum(nans) > 0.0) m = NAN;  // a NaN anywhere makes the row NaN, as on the CPU
  double sum_exp = 0.0;
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) sum_exp += exp(static_cast<double>(to_acc(x[k])) - m);
  const double lse = m + log(block_sum(sum_exp));
  double l = 0.0;
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x)
    l += static_cast<double>(to_acc(t[k])) * (lse - static_cast<double>(to_acc(x[k])));
  l = block_sum(l);
  if (threadIdx.x == 0) loss[row] = from_acc<T>(l);
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x)
    probs[row * K + k] = from_acc<T>(exp(static_cast<double>(to_acc(x[k])) - lse));
}

template <class T>
__global__ void soft_cross_entropy_backward_kernel(const double* w, const T* probs, const T* targets,
                                                   int64_t K, T* grad) {
  const int64_t row = blockIdx.x;
  double mass = 0.0;
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) mass += to_acc(targets[row * K + k]);
  mass = block_sum(mass);
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
    const int64_t i = row * K + k;
    grad[i] = from_acc<T>(w[row] * (static_cast<double>(to_acc(probs[i])) * mass - to_acc(targets[i])));
  }
}

template <class T>
__global__ void bce_with_logits_kernel(const T* logits, const T* targets, int64_t K, T* loss) {
  const int64_t row = blockIdx.x;
  double sum = 0.0;
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
    const double x = to_acc(logits[row * K + k]), t = to_acc(targets[row * K + k]);
    sum += fmax(x, 0.0) - x * t + log1p(exp(-fabs(x)));
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0) loss[row] = from_acc<T>(sum / static_cast<double>(K));
}

}  // namespace
}  // namespace cuda

std::pair<Tensor, Tensor> CudaBackend::soft_cross_entropy(const Tensor& logits_in, const Tensor& targets_in) {
  using namespace cuda;
  const int64_t K = device_soft_targets(logits_in, targets_in, "soft_cross_entropy");
  const int64_t N = logits_in.size(0);
  const Tensor logits = logits_in.contiguous();
  const Tensor targets = targets_in.to(logits.dtype()).contiguous();
  Tensor loss = empty({N}, logits.dtype()), probs = empty({N, K}, logits.dtype());
  if (N == 0) return {loss, probs};
  CUDA_DISPATCH_FLOAT(logits.dtype(), "soft_cross_entropy", [&] {
    soft_cross_entropy_kernel<scalar_t><<<static_cast<unsigned>(N), kRowThreads, 0, cuda_stream()>>>(
        static_cast<const scalar_t*>(logits.raw_data()), static_cast<const scalar_t*>(targets.raw_data()), K,
        static_cast<scalar_t*>(loss.raw_data()), static_cast<scalar_t*>(probs.raw_data()));
    CUDA_CHECK_LAUNCH();
  });
  return {loss, probs};
}

Tensor CudaBackend::soft_cross_entropy_backward(const Tensor& grad_loss, const Tensor& probs_in,
                                                const Tensor& targets_in) {
  using namespace cuda;
  const int64_t K = device_soft_targets(probs_in, targets_in, "soft_cross_entropy_backward");
  const int64_t N = probs_in.size(0);
  const Tensor w = device_weights(grad_loss, N, "soft_cross_entropy_backward");
  const Tensor probs = probs_in.contiguous();
  const Tensor targets = targets_in.to(probs.dtype()).contiguous();
  Tensor grad = empty({N, K}, probs.dtype());
  if (N == 0) return grad;
  CUDA_DISPATCH_FLOAT(probs.dtype(), "soft_cross_entropy_backward", [&] {
    soft_cross_entropy_backward_kernel<scalar_t><<<static_cast<unsigned>(N), kRowThreads, 0, cuda_stream()>>>(
        static_cast<const double*>(w.raw_data()), static_cast<const scalar_t*>(probs.raw_data()),
        static_cast<const scalar_t*>(targets.raw_data()), K, static_cast<scalar_t*>(grad.raw_data()));
    CUDA_CHECK_LAUNCH();
  });
  return grad;
}

Tensor CudaBackend::bce_with_logits(const Tensor& logits_in, const Tensor& targets_in) {
  using namespace cuda;
  const int64_t K = device_soft_targets(logits_in, targets_in, "bce_with_logits");
  const int64_t N = logits_in.size(0);
  const Tensor logits = logits_in.contiguous();
  const Tensor targets = targets_in.to(logits.dtype()).contiguous();
  Tensor loss = empty({N}, logits.dtype());
  if (N == 0) return loss;
  CUDA_DISPATCH_FLOAT(logits.dtype(), "bce_with_logits", [&] {
    bce_with_logits_kernel<scalar_t><<<static_cast<unsigned>(N), kRowThreads, 0, cuda_stream()>>>(
        static_cast<const scalar_t*>(logits.raw_data()), static_cast<const scalar_t*>(targets.raw_data()), K,
        static_cast<scalar_t*>(loss.raw_data()));
    CUDA_CHECK_LAUNCH();
  });
  return loss;
}

Tensor CudaBackend::bce_with_logits_backward(const Tensor& grad_loss, const Tensor& logits_in,
                                             const Tensor& targets_in) {
  using namespace cuda;
  const int64_t K = device_soft_targets(logits_in, targets_in, "bce_with_logits_backward");
  const int64_t N = logits_in.size(0);
  const Tensor w = device_weights(grad_loss, N, "bce_with_logits_backward");
  const Tensor logits = logits_in.contiguous();
  const Tensor targets = targets_in.to(logits.dtype()).contiguous();
  Tensor grad = empty({N, K}, logits.dtype());
  CUDA_DISPATCH_FLOAT(logits.dtype(), "bce_with_logits_backward", [&] {
    const scalar_t* px = static_cast<const scalar_t*>(logits.raw_data());
    const scalar_t* pt = static_cast<const scalar_t*>(targets.raw_data());
    const double* pw = static_cast<const double*>(w.raw_data());
    scalar_t* pg = static_cast<scalar_t*>(grad.raw_data());
    const double inv_k = 1.0 / static_cast<double>(K);
    for_each(N * K, [=] __device__(int64_t i) {
      const double sigmoid = 1.0 / (1.0 + exp(-static_cast<double>(to_acc(px[i]))));
      pg[i] = from_acc<scalar_t>(pw[i / K] * (sigmoid - static_cast<double>(to_acc(pt[i]))) * inv_k);
    });
  });
  return grad;
}

}  // namespace trainer
