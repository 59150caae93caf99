// Layer norm on the GPU: one block per row of x's memory (Backend::layer_norm's [rows,
// normalized_size]), so the channels of a channels-last image batch and the last dimension of a
// transformer's activations are the same kernel. Half inputs compute in f32; statistics, gamma and beta
// are f32 (f64 for f64 inputs). The variance is a second pass over the row (the row is in L1/L2 by then),
// so a mean far from zero cancels nothing. The weight and bias gradients are column sums over all rows
// in a fixed order: deterministic, no atomics.
#include <algorithm>

#include "nn/cuda/kernels.cuh"
#include "nn/kernel_checks.h"

namespace trainer {
namespace cuda {
namespace {

// gamma or beta as the compute type's [C] (a bf16 weight beside a bf16 input is converted, a copy of
// C values), or undefined.
Tensor as_compute_dtype(const Tensor& t, DType x_dtype) {
  return t.defined() ? t.to(accumulate_dtype(x_dtype)).contiguous() : Tensor();
}

template <class A>
const A* data_or_null(const Tensor& t) {
  return t.defined() ? static_cast<const A*>(t.raw_data()) : nullptr;
}

template <class T, class A>
__global__ void layer_norm_kernel(const T* x, const A* gamma, const A* beta, T* y, A* mean_out, A* rstd_out,
                                  int64_t C, A eps) {
  using std::sqrt;
  const int64_t r = blockIdx.x;
  const T* xr = x + r * C;
  T* yr = y + r * C;
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
    yr[c] = store<T>(gamma ? xhat * gamma[c] + (beta ? beta[c] : A(0)) : xhat);
  }
}

// grad_x = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * gamma, per row.
template <class T, class A>
__global__ void layer_norm_grad_x_kernel(const T* dy, const T* x, const A* mean, const A* rstd,
                                         const A* gamma, T* dx, int64_t C) {
  const int64_t r = blockIdx.x;
  const T *dyr = dy + r * C, *xr = x + r * C;
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

// grad_gamma[c] = sum over rows of dy * xhat, grad_beta[c] = sum of dy. Block (tile, part) takes 32
// columns of one part of the rows (kParamGradRows row strides, each thread a strided partial sum,
// added in row order at the end) and writes that part's sums at [part * C + c]; with several parts
// param_grads_sum_parts adds them in part order (fixed: the result does not depend on scheduling).
// Splitting the rows matters for ViTs: C = 768 gives 24 column tiles, far too few blocks for a GPU.
constexpr int kParamGradRows = 16;

template <class T, class A>
__global__ void layer_norm_param_grads_kernel(const T* dy, const T* x, const A* mean, const A* rstd,
                                              A* part_gamma_out, A* part_beta_out, int64_t rows,
                                              int64_t rows_per_part, int64_t C) {
  __shared__ A part_gamma[kParamGradRows][33], part_beta[kParamGradRows][33];  // 33: no bank conflicts
  const int64_t c = blockIdx.x * 32 + threadIdx.x;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * rows_per_part;
  const int64_t end = min(rows, begin + rows_per_part);
  A dgamma = 0, dbeta = 0;
  if (c < C)
    for (int64_t r = begin + threadIdx.y; r < end; r += kParamGradRows) {
      const A d = to_acc(dy[r * C + c]);
      dgamma += d * (to_acc(x[r * C + c]) - mean[r]) * rstd[r];
      dbeta += d;
    }
  part_gamma[threadIdx.y][threadIdx.x] = dgamma;
  part_beta[threadIdx.y][threadIdx.x] = dbeta;
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
  for (int k = 1; k < kParamGradRows; ++k)
    dgamma += part_gamma[k][threadIdx.x], dbeta += part_beta[k][threadIdx.x];
  part_gamma_out[blockIdx.y * C + c] = dgamma;
  part_beta_out[blockIdx.y * C + c] = dbeta;
}

template <class A>
__global__ void param_grads_sum_parts(const A* part_gamma, const A* part_beta, int parts, int64_t C,
                                      A* grad_gamma, A* grad_beta) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  A g = 0, b = 0;
  for (int p = 0; p < parts; ++p) g += part_gamma[p * C + c], b += part_beta[p * C + c];
  grad_gamma[c] = g;
  grad_beta[c] = b;
}

// Parts of the rows so that the column tiles x parts fill the GPU (about 4 blocks per SM), each part
// at least 256 rows.
int param_grad_parts(int64_t rows, int64_t C) {
  const int64_t tiles = (C + 31) / 32;
  const int64_t target = static_cast<int64_t>(cuda_context().sm_count) * 4;
  return static_cast<int>(
      std::clamp<int64_t>((target + tiles - 1) / tiles, 1, std::max<int64_t>(1, rows / 256)));
}

void check_rows_fit_grid(int64_t rows, const char* op) {
  if (rows > 0x7fffffff)
    throw std::invalid_argument(std::string(op) + ": " + std::to_string(rows) + " rows exceed one grid");
}

}  // namespace
}  // namespace cuda

LayerNormForward CudaBackend::layer_norm(const Tensor& x, int64_t normalized_size, const Tensor& gamma,
                                         const Tensor& beta, double eps) {
  using namespace cuda;
  check_device(x, "layer_norm", "input");
  const int64_t rows = check_layer_norm(x, normalized_size, gamma, beta, "layer_norm");
  check_rows_fit_grid(rows, "layer_norm");
  const int64_t C = normalized_size;
  const DType stats = accumulate_dtype(x.dtype());
  LayerNormForward out{empty(x.shape(), x.dtype(), x.suggest_memory_format()), empty({rows}, stats),
                       empty({rows}, stats)};
  if (rows == 0) return out;
  const Tensor g = as_compute_dtype(gamma, x.dtype()), b = as_compute_dtype(beta, x.dtype());
  const int threads = row_block_threads(C);
  CUDA_DISPATCH_FLOAT(x.dtype(), "layer_norm", [&] {
    using acc = acc_t<scalar_t>;
    layer_norm_kernel<scalar_t, acc><<<static_cast<unsigned>(rows), threads, 0, cuda_stream()>>>(
        static_cast<const scalar_t*>(x.raw_data()), data_or_null<acc>(g), data_or_null<acc>(b),
        static_cast<scalar_t*>(out.y.raw_data()), static_cast<acc*>(out.mean.raw_data()),
        static_cast<acc*>(out.rstd.raw_data()), C, static_cast<acc>(eps));
    CUDA_CHECK_LAUNCH();
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
    using acc = acc_t<scalar_t>;
    const scalar_t *pdy = static_cast<const scalar_t*>(dy.raw_data()),
                   *px = static_cast<const scalar_t*>(x.raw_data());
    const acc *pmean = static_cast<const acc*>(mean.raw_data()),
              *prstd = static_cast<const acc*>(rstd.raw_data());
    layer_norm_grad_x_kernel<scalar_t, acc>
        <<<static_cast<unsigned>(rows), row_block_threads(C), 0, cuda_stream()>>>(
            pdy, px, pmean, prstd, data_or_null<acc>(g), static_cast<scalar_t*>(out.grad_x.raw_data()), C);
    CUDA_CHECK_LAUNCH();
    if (!gamma.defined()) return;
    const int parts = param_grad_parts(rows, C);
    const int64_t rows_per_part = (rows + parts - 1) / parts;
    acc* grad_gamma = static_cast<acc*>(out.grad_gamma.raw_data());
    acc* grad_beta = static_cast<acc*>(out.grad_beta.raw_data());
    Tensor partials = parts > 1 ? empty({2, parts, C}, stats) : Tensor();
    acc* part_gamma = parts > 1 ? static_cast<acc*>(partials.raw_data()) : grad_gamma;
    acc* part_beta = parts > 1 ? part_gamma + parts * C : grad_beta;
    const dim3 block(32, kParamGradRows),
        grid(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>(parts));
    layer_norm_param_grads_kernel<scalar_t, acc><<<grid, block, 0, cuda_stream()>>>(
        pdy, px, pmean, prstd, part_gamma, part_beta, rows, rows_per_part, C);
    CUDA_CHECK_LAUNCH();
    if (parts == 1) return;
    param_grads_sum_parts<acc><<<static_cast<unsigned>((C + 255) / 256), 256, 0, cuda_stream()>>>(
        part_gamma, part_beta, parts, C, grad_gamma, grad_beta);
    CUDA_CHECK_LAUNCH();
  });
  return out;
}

}  // namespace trainer
