// Classification loss and metrics with the CPU backend's semantics: fused log-softmax cross-entropy
// with label smoothing (row reductions in double), its gradient, top-k hits and argmax.
//
// Targets may live on the host or the device. Host targets are range-checked like on the CPU;
// device targets are not (a check would stall the stream): an out-of-range target yields a NaN
// loss, which the training loop reports.
#include "nn/cuda/kernels.cuh"
#include "nn/kernel_checks.h"

namespace trainer {
namespace cuda {
namespace {

constexpr int kRowThreads = 128;

int64_t device_logits_classes(const Tensor& logits, const char* op) {
  check_device(logits, op, "logits");
  return check_logits(logits, op);
}

// Targets as a contiguous device i64 [N]; host targets are range-checked on their way over.
Tensor device_targets(const Tensor& targets, int64_t n, int64_t k, const char* op) {
  if (!targets.device().is_cuda()) return host_targets_in_range(targets, n, k, op).to(current_device());
  check_targets_shape(targets, n, op);
  return targets.contiguous();
}

struct MaxOp {
  __device__ double operator()(double a, double b) const { return a > b ? a : b; }
};

// One block per row.
template <class T>
__global__ void cross_entropy_kernel(const T* logits, const int64_t* targets, int64_t K, double eps, T* loss,
                                     T* probs) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * K;
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
  double sum_exp = 0.0, sum_logits = 0.0;
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
    const double v = to_acc(x[k]);
    sum_exp += exp(v - m);
    sum_logits += v;
  }
  sum_exp = block_sum(sum_exp);
  sum_logits = block_sum(sum_logits);
  const double lse = m + log(sum_exp);
  if (threadIdx.x == 0) {
    const int64_t t = targets[row];
    double l = NAN;
    if (t >= 0 && t < K) {
      l = (1.0 - eps) * (lse - static_cast<double>(to_acc(x[t])));
      if (eps > 0.0) l += eps * (lse - sum_logits / static_cast<double>(K));
    }
    loss[row] = from_acc<T>(l);
  }
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x)
    probs[row * K + k] = from_acc<T>(exp(to_acc(x[k]) - lse));
}

}  // namespace
}  // namespace cuda

std::pair<Tensor, Tensor> CudaBackend::cross_entropy(const Tensor& logits_in, const Tensor& targets_in,
                                                     double label_smoothing) {
  using namespace cuda;
  const int64_t K = device_logits_classes(logits_in, "cross_entropy");
  const int64_t N = logits_in.size(0);
  check_label_smoothing(label_smoothing, "cross_entropy");
  const Tensor targets = device_targets(targets_in, N, K, "cross_entropy");
  const Tensor logits = logits_in.contiguous();
  Tensor loss = empty({N}, logits.dtype()), probs = empty({N, K}, logits.dtype());
  if (N == 0) return {loss, probs};
  CUDA_DISPATCH_FLOAT(logits.dtype(), "cross_entropy", [&] {
    cross_entropy_kernel<scalar_t><<<static_cast<unsigned>(N), kRowThreads, 0, cuda_stream()>>>(
        static_cast<const scalar_t*>(logits.raw_data()), static_cast<const int64_t*>(targets.raw_data()), K,
        label_smoothing, static_cast<scalar_t*>(loss.raw_data()), static_cast<scalar_t*>(probs.raw_data()));
    CUDA_CHECK_LAUNCH();
  });
  return {loss, probs};
}

Tensor CudaBackend::cross_entropy_backward(const Tensor& grad_loss, const Tensor& probs_in,
                                           const Tensor& targets_in, double label_smoothing) {
  using namespace cuda;
  const int64_t K = device_logits_classes(probs_in, "cross_entropy_backward");
  const int64_t N = probs_in.size(0);
  check_label_smoothing(label_smoothing, "cross_entropy_backward");
  if (grad_loss.dim() != 1 || grad_loss.size(0) != N)
    throw std::invalid_argument("cross_entropy_backward: grad_loss must have shape [" + std::to_string(N) +
                                "], got " + shape_str(grad_loss.shape()));
  const Tensor targets = device_targets(targets_in, N, K, "cross_entropy_backward");
  const Tensor w = grad_loss.to(current_device()).to(DType::f64).contiguous();
  const Tensor probs = probs_in.contiguous();
  Tensor grad = empty({N, K}, probs.dtype());
  // d loss_i / d x_ik = p_ik - q_ik with the smoothed target q = (1 - eps) onehot + eps / K.
  const double off = label_smoothing / static_cast<double>(K), on = 1.0 - label_smoothing + off;
  CUDA_DISPATCH_FLOAT(probs.dtype(), "cross_entropy_backward", [&] {
    const scalar_t* pp = static_cast<const scalar_t*>(probs.raw_data());
    const int64_t* pt = static_cast<const int64_t*>(targets.raw_data());
    const double* pw = static_cast<const double*>(w.raw_data());
    scalar_t* pg = static_cast<scalar_t*>(grad.raw_data());
    for_each(N * K, [=] __device__(int64_t i) {
      const int64_t row = i / K, k = i - row * K;
      const double q = pt[row] == k ? on : off;
      pg[i] = from_acc<scalar_t>(pw[row] * (static_cast<double>(to_acc(pp[i])) - q));
    });
  });
  return grad;
}

Tensor CudaBackend::topk_correct(const Tensor& logits_in, const Tensor& targets_in, int k) {
  using namespace cuda;
  const int64_t K = device_logits_classes(logits_in, "topk_correct");
  const int64_t N = logits_in.size(0);
  if (k < 1) throw std::invalid_argument("topk_correct: k must be at least 1, got " + std::to_string(k));
  const Tensor targets = device_targets(targets_in, N, K, "topk_correct");
  const Tensor logits = logits_in.contiguous();
  Tensor out = empty({N}, DType::u8);
  CUDA_DISPATCH_FLOAT(logits.dtype(), "topk_correct", [&] {
    const scalar_t* px = static_cast<const scalar_t*>(logits.raw_data());
    const int64_t* pt = static_cast<const int64_t*>(targets.raw_data());
    uint8_t* po = static_cast<uint8_t*>(out.raw_data());
    // One warp per row counts the logits strictly above the target's (NaNs rank above all numbers).
    for_each(N * 32, [=] __device__(int64_t i) {
      const int64_t row = i / 32;
      const int lane = static_cast<int>(i % 32);
      const scalar_t* x = px + row * K;
      const int64_t t = pt[row];
      const bool valid = t >= 0 && t < K;
      const auto target = valid ? to_acc(x[t]) : to_acc(x[0]);
      int greater = 0;
      for (int64_t j = lane; j < K; j += 32) {
        const auto v = to_acc(x[j]);
        greater += (v > target || isnan(v)) ? 1 : 0;
      }
      greater = warp_sum(greater);
      if (lane == 0) po[row] = (valid && !isnan(target) && greater < k) ? 1 : 0;
    });
  });
  return out;
}

Tensor CudaBackend::argmax(const Tensor& logits_in) {
  using namespace cuda;
  const int64_t K = device_logits_classes(logits_in, "argmax");
  const int64_t N = logits_in.size(0);
  const Tensor logits = logits_in.contiguous();
  Tensor out = empty({N}, DType::i64);
  CUDA_DISPATCH_FLOAT(logits.dtype(), "argmax", [&] {
    using acc = acc_t<scalar_t>;
    const scalar_t* px = static_cast<const scalar_t*>(logits.raw_data());
    int64_t* po = static_cast<int64_t*>(out.raw_data());
    // One warp per row; the first NaN wins, else the first index of the maximum, as torch.argmax.
    for_each(N * 32, [=] __device__(int64_t i) {
      const int64_t row = i / 32;
      const int lane = static_cast<int>(i % 32);
      const scalar_t* x = px + row * K;
      acc best = 0;
      int64_t best_i = -1;
      auto better = [](acc v, int64_t vi, acc b, int64_t bi) {
        if (bi < 0) return vi >= 0;
        if (vi < 0) return false;
        if (isnan(v) || isnan(b)) return isnan(v) && (!isnan(b) || vi < bi);
        return v > b || (v == b && vi < bi);
      };
      for (int64_t j = lane; j < K; j += 32) {
        const acc v = to_acc(x[j]);
        if (better(v, j, best, best_i)) best = v, best_i = j;
      }
      for (int o = 16; o > 0; o >>= 1) {
        const acc v = __shfl_xor_sync(0xffffffffu, best, o);
        const int64_t vi = __shfl_xor_sync(0xffffffffu, best_i, o);
        if (better(v, vi, best, best_i)) best = v, best_i = vi;
      }
      if (lane == 0) po[row] = best_i;
    });
  });
  return out;
}

}  // namespace trainer
