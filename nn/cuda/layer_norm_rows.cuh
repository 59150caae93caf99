#pragma once
// What the layer norm kernels share (nn/cuda/layer_norm.cu, and add_layer_norm.cu, which fuses the
// residual add before a norm): rows of Backend::layer_norm's [rows, normalized_size] view, the warp-per-row
// geometry, the dtype dispatch of a half output beside an f32 input, and the weight and bias gradients
// as deterministic column sums.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "nn/cuda/kernels.cuh"

namespace trainer::cuda {

// gamma or beta as the compute type's [C] (a bf16 weight beside a bf16 input is converted, a copy of
// C values), or undefined.
inline Tensor as_compute_dtype(const Tensor& t, DType x_dtype) {
  return t.defined() ? t.to(accumulate_dtype(x_dtype)).contiguous() : Tensor();
}

template <class A>
const A* data_or_null(const Tensor& t) {
  return t.defined() ? static_cast<const A*>(t.raw_data()) : nullptr;
}

// Rows of up to 32 * kPerLane values: a warp per row, each lane holding its kPerLane values (c = lane +
// 32 j, so each load of the warp is one coalesced run) in registers, so x is read from memory once and
// the reductions are warp shuffles with no block barrier. ViT (384, 768) and ConvNeXt (96..768) rows
// fit; longer rows take layer_norm.cu's block-per-row kernels.
constexpr int kRowsPerBlock = 4;  // warps per block

// grad_gamma[c] = sum over rows of dy * xhat, grad_beta[c] = sum of dy. Block (tile, part) takes 32
// columns of one part of the rows (kParamGradRows row strides, each thread a strided partial sum,
// added in row order at the end) and writes that part's sums at [part * C + c]; with several parts
// param_grads_sum_parts adds them in part order (fixed: the result does not depend on scheduling).
// Splitting the rows matters for ViTs: C = 768 gives 24 column tiles, far too few blocks for a GPU.
constexpr int kParamGradRows = 16;

template <class D, class T, class A>
__global__ void layer_norm_param_grads_kernel(const D* dy, const T* x, const A* mean, const A* rstd,
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
inline int param_grad_parts(int64_t rows, int64_t C) {
  const int64_t tiles = (C + 31) / 32;
  const int64_t target = static_cast<int64_t>(cuda_context().sm_count) * 4;
  return static_cast<int>(
      std::clamp<int64_t>((target + tiles - 1) / tiles, 1, std::max<int64_t>(1, rows / 256)));
}

inline void check_rows_fit_grid(int64_t rows, const char* op) {
  if (rows > 0x7fffffff)
    throw std::invalid_argument(std::string(op) + ": " + std::to_string(rows) + " rows exceed one grid");
}

// grad_gamma and grad_beta ([C] in the compute type) of the rows of dy and x.
template <class D, class T>
void launch_layer_norm_param_grads(const D* dy, const T* x, const acc_t<T>* mean, const acc_t<T>* rstd,
                                   Tensor& grad_gamma_out, Tensor& grad_beta_out, int64_t rows, int64_t C) {
  using A = acc_t<T>;
  const int parts = param_grad_parts(rows, C);
  const int64_t rows_per_part = (rows + parts - 1) / parts;
  A* grad_gamma = static_cast<A*>(grad_gamma_out.raw_data());
  A* grad_beta = static_cast<A*>(grad_beta_out.raw_data());
  Tensor partials = parts > 1 ? empty({2, parts, C}, grad_gamma_out.dtype()) : Tensor();
  A* part_gamma = parts > 1 ? static_cast<A*>(partials.raw_data()) : grad_gamma;
  A* part_beta = parts > 1 ? part_gamma + parts * C : grad_beta;
  const dim3 block(32, kParamGradRows),
      grid(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>(parts));
  layer_norm_param_grads_kernel<D, T, A>
      <<<grid, block, 0, cuda_stream()>>>(dy, x, mean, rstd, part_gamma, part_beta, rows, rows_per_part, C);
  CUDA_CHECK_LAUNCH();
  if (parts == 1) return;
  param_grads_sum_parts<A><<<static_cast<unsigned>((C + 255) / 256), 256, 0, cuda_stream()>>>(
      part_gamma, part_beta, parts, C, grad_gamma, grad_beta);
  CUDA_CHECK_LAUNCH();
}

// The warp kernels' values per lane for rows of C (0: the row is longer than they take).
inline int per_lane_for(int64_t C) {
  for (int k : {4, 8, 16, 32})
    if (C <= 32 * k) return k;
  return 0;
}

// Calls f with the per-lane count as a compile-time constant.
template <class F>
void with_per_lane(int per_lane, F&& f) {
  switch (per_lane) {
    case 4:
      return f(std::integral_constant<int, 4>{});
    case 8:
      return f(std::integral_constant<int, 8>{});
    case 16:
      return f(std::integral_constant<int, 16>{});
    default:
      return f(std::integral_constant<int, 32>{});
  }
}

// Binds out_t to the element type of a layer norm's output (or its gradient's) beside an input of
// element type scalar_t: the input's own, or a half dtype beside an f32 input.
template <class T, class F>
void with_half_or_same(DType dtype, F&& f) {
  if constexpr (std::is_same_v<T, float>) {
    if (dtype == DType::bf16) return f(__nv_bfloat16{});
    if (dtype == DType::f16) return f(__half{});
  }
  f(T{});
}

}  // namespace trainer::cuda
