// Layer norm on the GPU: a warp per row of x's memory (Backend::layer_norm's [rows, normalized_size];
// a block per row beyond 1024 values), so the channels of a channels-last image batch and the last
// dimension of a transformer's activations are the same kernel. Half inputs compute in f32; statistics, gamma
// and beta are f32 (f64 for f64 inputs). The variance is a second pass over the row (the row is in L1/L2 by
// then), so a mean far from zero cancels nothing. The weight and bias gradients are column sums over all rows
// in a fixed order: deterministic, no atomics.
#include <algorithm>
#include <type_traits>

#include "nn/cuda/layer_norm_rows.cuh"
#include "nn/kernel_checks.h"

namespace trainer {
namespace cuda {
namespace {

template <class T, class O, class A, int kPerLane>
__global__ void layer_norm_warp_kernel(const T* x, const A* gamma, const A* beta, O* y, A* mean_out,
                                       A* rstd_out, int64_t rows, int64_t C, A eps) {
  using std::sqrt;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  if (r >= rows) return;
  const int lane = threadIdx.x;
  const T* xr = x + r * C;
  A v[kPerLane];
  A sum = 0;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t c = lane + 32 * j;
    v[j] = c < C ? to_acc(xr[c]) : A(0);
    sum += v[j];
  }
  const A mean = warp_sum(sum) / static_cast<A>(C);
  A squares = 0;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j)
    if (lane + 32 * j < C) squares += (v[j] - mean) * (v[j] - mean);
  const A rstd = A(1) / sqrt(warp_sum(squares) / static_cast<A>(C) + eps);
  if (lane == 0) mean_out[r] = mean, rstd_out[r] = rstd;
  O* yr = y + r * C;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t c = lane + 32 * j;
    if (c >= C) continue;
    const A xhat = (v[j] - mean) * rstd;
    yr[c] = store<O>(gamma ? xhat * gamma[c] + (beta ? beta[c] : A(0)) : xhat);
  }
}

template <class T, class O, class A>
__global__ void layer_norm_kernel(const T* x, const A* gamma, const A* beta, O* y, A* mean_out, A* rstd_out,
                                  int64_t C, A eps) {
  using std::sqrt;
  const int64_t r = blockIdx.x;
  const T* xr = x + r * C;
  O* yr = y + r * C;
  A sum = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) sum += to_acc(xr[c]);
  const A mean = block_sum(sum) / static_cast<A>(C);
  A squares = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const A d = to_acc(xr[c]) - mean;
    squares += d * d;
  }
  const A rstd = A(1) / sqrt(block_sum(squares) / static_cast<A>(C) + eps);
  if (threadIdx.x == 0) mean_out[r] = mean, rstd_out[r] = rstd;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const A xhat = (to_acc(xr[c]) - mean) * rstd;
    yr[c] = store<O>(gamma ? xhat * gamma[c] + (beta ? beta[c] : A(0)) : xhat);
  }
}

// grad_x = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * gamma, per row; dy
// (D) is x's dtype or the half dtype of a forward that stored y as half.
template <class D, class T, class A, int kPerLane>
__global__ void layer_norm_grad_x_warp_kernel(const D* dy, const T* x, const A* mean, const A* rstd,
                                              const A* gamma, T* dx, int64_t rows, int64_t C) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  if (r >= rows) return;
  const int lane = threadIdx.x;
  const D* dyr = dy + r * C;
  const T* xr = x + r * C;
  const A m = mean[r], s = rstd[r];
  A dxhat[kPerLane], xhat[kPerLane];
  A sum_dxhat = 0, sum_dxhat_xhat = 0;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t c = lane + 32 * j;
    const bool in = c < C;
    dxhat[j] = in ? (gamma ? to_acc(dyr[c]) * gamma[c] : to_acc(dyr[c])) : A(0);
    xhat[j] = in ? (to_acc(xr[c]) - m) * s : A(0);
    sum_dxhat += dxhat[j];
    sum_dxhat_xhat += dxhat[j] * xhat[j];
  }
  const A mean_dxhat = warp_sum(sum_dxhat) / static_cast<A>(C);
  const A mean_dxhat_xhat = warp_sum(sum_dxhat_xhat) / static_cast<A>(C);
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t c = lane + 32 * j;
    if (c < C) dx[r * C + c] = store<T>(s * (dxhat[j] - mean_dxhat - xhat[j] * mean_dxhat_xhat));
  }
}

template <class D, class T, class A>
__global__ void layer_norm_grad_x_kernel(const D* dy, const T* x, const A* mean, const A* rstd,
                                         const A* gamma, T* dx, int64_t C) {
  const int64_t r = blockIdx.x;
  const D* dyr = dy + r * C;
  const T* xr = x + r * C;
  const A m = mean[r], s = rstd[r];
  A sum_dxhat = 0, sum_dxhat_xhat = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const A dxhat = gamma ? to_acc(dyr[c]) * gamma[c] : to_acc(dyr[c]);
    sum_dxhat += dxhat;
    sum_dxhat_xhat += dxhat * (to_acc(xr[c]) - m) * s;
  }
  const A mean_dxhat = block_sum(sum_dxhat) / static_cast<A>(C);
  const A mean_dxhat_xhat = block_sum(sum_dxhat_xhat) / static_cast<A>(C);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const A dxhat = gamma ? to_acc(dyr[c]) * gamma[c] : to_acc(dyr[c]);
    dx[r * C + c] = store<T>(s * (dxhat - mean_dxhat - (to_acc(xr[c]) - m) * s * mean_dxhat_xhat));
  }
}

}  // namespace
}  // namespace cuda

namespace cuda {
namespace {

template <class T, class O>
void launch_layer_norm(const Tensor& x, const Tensor& g, const Tensor& b, LayerNormForward& out, int64_t rows,
                       int64_t C, double eps) {
  using A = acc_t<T>;
  const T* px = static_cast<const T*>(x.raw_data());
  O* py = static_cast<O*>(out.y.raw_data());
  A *pmean = static_cast<A*>(out.mean.raw_data()), *prstd = static_cast<A*>(out.rstd.raw_data());
  const int per_lane = per_lane_for(C);
  if (per_lane == 0) {
    layer_norm_kernel<T, O, A><<<static_cast<unsigned>(rows), row_block_threads(C), 0, cuda_stream()>>>(
        px, data_or_null<A>(g), data_or_null<A>(b), py, pmean, prstd, C, static_cast<A>(eps));
    CUDA_CHECK_LAUNCH();
    return;
  }
  const unsigned blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  with_per_lane(per_lane, [&](auto k) {
    layer_norm_warp_kernel<T, O, A, decltype(k)::value>
        <<<blocks, dim3(32, kRowsPerBlock), 0, cuda_stream()>>>(
            px, data_or_null<A>(g), data_or_null<A>(b), py, pmean, prstd, rows, C, static_cast<A>(eps));
    CUDA_CHECK_LAUNCH();
  });
}

template <class D, class T>
void launch_layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                const Tensor& g, LayerNormGrads& out, int64_t rows, int64_t C) {
  using A = acc_t<T>;
  const D* pdy = static_cast<const D*>(dy.raw_data());
  const T* px = static_cast<const T*>(x.raw_data());
  const A *pmean = static_cast<const A*>(mean.raw_data()), *prstd = static_cast<const A*>(rstd.raw_data());
  T* pdx = static_cast<T*>(out.grad_x.raw_data());
  const int per_lane = per_lane_for(C);
  if (per_lane == 0) {
    layer_norm_grad_x_kernel<D, T, A>
        <<<static_cast<unsigned>(rows), row_block_threads(C), 0, cuda_stream()>>>(pdy, px, pmean, prstd,
                                                                                  data_or_null<A>(g), pdx, C);
    CUDA_CHECK_LAUNCH();
  } else {
    const unsigned blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
    with_per_lane(per_lane, [&](auto k) {
      layer_norm_grad_x_warp_kernel<D, T, A, decltype(k)::value>
          <<<blocks, dim3(32, kRowsPerBlock), 0, cuda_stream()>>>(pdy, px, pmean, prstd, data_or_null<A>(g),
                                                                  pdx, rows, C);
      CUDA_CHECK_LAUNCH();
    });
  }
  if (g.defined())
    launch_layer_norm_param_grads<D, T>(pdy, px, pmean, prstd, out.grad_gamma, out.grad_beta, rows, C);
}

}  // namespace
}  // namespace cuda

LayerNormForward CudaBackend::layer_norm(const Tensor& x, int64_t normalized_size, const Tensor& gamma,
                                         const Tensor& beta, double eps, DType y_dtype) {
  using namespace cuda;
  check_device(x, "layer_norm", "input");
  const int64_t rows = check_layer_norm(x, normalized_size, gamma, beta, "layer_norm");
  check_layer_norm_output_dtype(y_dtype, x.dtype(), "layer_norm");
  check_rows_fit_grid(rows, "layer_norm");
  const DType stats = accumulate_dtype(x.dtype());
  LayerNormForward out{empty(x.shape(), y_dtype, x.suggest_memory_format()), empty({rows}, stats),
                       empty({rows}, stats)};
  if (rows == 0) return out;
  const Tensor g = as_compute_dtype(gamma, x.dtype()), b = as_compute_dtype(beta, x.dtype());
  CUDA_DISPATCH_FLOAT(x.dtype(), "layer_norm", [&] {
    with_half_or_same<scalar_t>(y_dtype, [&](auto o) {
      launch_layer_norm<scalar_t, decltype(o)>(x, g, b, out, rows, normalized_size, eps);
    });
  });
  return out;
}

LayerNormGrads CudaBackend::layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean,
                                                const Tensor& rstd, const Tensor& gamma) {
  using namespace cuda;
  check_device(x, "layer_norm_backward", "input");
  const int64_t C = check_layer_norm_backward(grad_y, x, mean, rstd, gamma, "layer_norm_backward");
  const int64_t rows = mean.numel();
  check_rows_fit_grid(rows, "layer_norm_backward");
  const MemoryFormat format = x.suggest_memory_format();
  const Tensor dy = grad_y.contiguous(format);  // read as x is: row r at r * C
  const Tensor g = as_compute_dtype(gamma, x.dtype());
  const DType stats = accumulate_dtype(x.dtype());
  LayerNormGrads out;
  out.grad_x = empty(x.shape(), x.dtype(), format);
  if (gamma.defined()) out.grad_gamma = empty({C}, stats), out.grad_beta = empty({C}, stats);
  if (rows == 0) {
    if (gamma.defined()) out.grad_gamma.fill_(0.0), out.grad_beta.fill_(0.0);
    return out;
  }
  CUDA_DISPATCH_FLOAT(x.dtype(), "layer_norm_backward", [&] {
    with_half_or_same<scalar_t>(dy.dtype(), [&](auto d) {
      launch_layer_norm_backward<decltype(d), scalar_t>(dy, x, mean, rstd, g, out, rows, C);
    });
  });
  return out;
}

}  // namespace trainer
