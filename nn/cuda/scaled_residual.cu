// y = x + h * scale[c] * keep[n] (Backend::scaled_residual_add) and its gradients: ConvNeXt's layer
// scale, drop path and residual add in one pass forward, and backward one pass that writes grad_h
// while it sums grad_scale's columns (the tiles and fixed-order part sums of layer_norm.cu's weight
// gradients: deterministic, no atomics).
#include <algorithm>

#include "nn/cuda/kernels.cuh"

namespace trainer {
namespace cuda {
namespace {

constexpr int kRowStrides = 16;  // row strides per column tile (blockDim.y)

// V consecutive elements per thread and iteration (16 bytes of x, h and y when V > 1, which needs V to
// divide C and aligned buffers): the channel and the sample are then two integer divisions per pack,
// not per element (64-bit divisions would cost more than the memory traffic). A sample is per_sample
// consecutive elements.
template <class T, class S, int V>
__global__ void scaled_residual_forward_kernel(const T* x, const T* h, const S* scale, const T* keep, T* y,
                                               int64_t packs, int64_t C, int64_t per_sample) {
  using P = Pack16<T>;
  for (int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; q < packs;
       q += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = q * V, c = i % C;  // a pack never crosses a row, so its channels are c .. c + V - 1
    const float k = keep ? to_acc(keep[i / per_sample]) : 1.0f;
    if constexpr (V == 1) {
      y[i] = store<T>(to_acc(x[i]) + to_acc(h[i]) * to_acc(scale[c]) * k);
    } else {
      const P xv = *reinterpret_cast<const P*>(x + i), hv = *reinterpret_cast<const P*>(h + i);
      P yv;
#pragma unroll
      for (int j = 0; j < V; ++j)
        yv.v[j] = store<T>(to_acc(xv.v[j]) + to_acc(hv.v[j]) * to_acc(scale[c + j]) * k);
      *reinterpret_cast<P*>(y + i) = yv;
    }
  }
}

// Block (tile, part): 32 columns of one part of the rows; writes grad_h for its elements and the part's
// column sums of grad_y * h * keep at part_sums[part * C + c].
template <class T, class S>
__global__ void scaled_residual_backward_kernel(const T* g, const T* h, const S* scale, const T* keep,
                                                T* grad_h, float* part_sums, int64_t rows,
                                                int64_t rows_per_part, int64_t C, int64_t rows_per_sample) {
  __shared__ float partial[kRowStrides][33];  // 33: no bank conflicts
  const int64_t c = blockIdx.x * 32 + threadIdx.x;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * rows_per_part;
  const int64_t end = min(rows, begin + rows_per_part);
  float sum = 0.0f;
  if (c < C) {
    const float s = to_acc(scale[c]);
    // The sample of row r, advanced as r grows instead of divided out per row.
    int64_t sample = (begin + threadIdx.y) / rows_per_sample, next = (sample + 1) * rows_per_sample;
    for (int64_t r = begin + threadIdx.y; r < end; r += kRowStrides) {
      while (r >= next) ++sample, next += rows_per_sample;
      const int64_t i = r * C + c;
      const float k = keep ? to_acc(keep[sample]) : 1.0f;
      const float gk = to_acc(g[i]) * k;
      grad_h[i] = store<T>(gk * s);
      sum += gk * to_acc(h[i]);
    }
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
  for (int k = 1; k < kRowStrides; ++k) sum += partial[k][threadIdx.x];
  part_sums[blockIdx.y * C + c] = sum;
}

template <class S>
__global__ void sum_column_parts(const float* part_sums, int parts, int64_t C, S* out) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  float total = 0.0f;
  for (int p = 0; p < parts; ++p) total += part_sums[p * C + c];
  out[c] = store<S>(total);
}

// The operands the kernels take: x and h of one half or f32 dtype, contiguous and of one shape with C
// innermost, scale [C] in f32 or h's dtype, keep undefined or [N] in h's dtype.
bool applies(const Tensor& x, const Tensor& h, const Tensor& scale, const Tensor& keep) {
  const DType t = h.dtype();
  const bool dtype_ok = (t == DType::f32 || is_half(t)) && x.dtype() == t &&
                        (scale.dtype() == DType::f32 || scale.dtype() == t) &&
                        (!keep.defined() || keep.dtype() == t);
  // At least [N, C]: a sample is then one or more whole rows of C.
  if (!dtype_ok || h.dim() < 2 || x.shape() != h.shape() || !x.is_contiguous() || !h.is_contiguous())
    return false;
  if (scale.dim() != 1 || scale.size(0) != h.size(-1) || !scale.is_contiguous()) return false;
  if (keep.defined() && (keep.dim() != 1 || keep.size(0) != h.size(0) || !keep.is_contiguous())) return false;
  return x.device() == h.device() && scale.device() == h.device() &&
         (!keep.defined() || keep.device() == h.device());
}

// Calls f(T{}, S{}) for h's element type and scale's.
template <class F>
void dispatch(DType h_dtype, DType scale_dtype, F&& f) {
  auto with_scale = [&](auto t) {
    using T = decltype(t);
    if (scale_dtype == DType::f32)
      f(t, float{});
    else
      f(t, T{});
  };
  switch (h_dtype) {
    case DType::bf16:
      return with_scale(__nv_bfloat16{});
    case DType::f16:
      return with_scale(__half{});
    default:
      return with_scale(float{});
  }
}

}  // namespace
}  // namespace cuda

std::optional<Tensor> CudaBackend::scaled_residual_add(const Tensor& x, const Tensor& h, const Tensor& scale,
                                                       const Tensor& keep) {
  using namespace cuda;
  if (!applies(x, h, scale, keep)) return std::nullopt;
  Tensor y = empty(h.shape(), h.dtype());
  const int64_t n = h.numel(), C = h.size(-1);
  if (n == 0) return y;
  const int64_t per_sample = n / h.size(0);
  dispatch(h.dtype(), scale.dtype(), [&](auto t, auto s) {
    using T = decltype(t);
    using S = decltype(s);
    constexpr int V = Pack16<T>::kSize;
    const T *px = static_cast<const T*>(x.raw_data()), *ph = static_cast<const T*>(h.raw_data());
    const S* pscale = static_cast<const S*>(scale.raw_data());
    const T* pkeep = keep.defined() ? static_cast<const T*>(keep.raw_data()) : nullptr;
    T* py = static_cast<T*>(y.raw_data());
    if (C % V == 0 && aligned16(px) && aligned16(ph) && aligned16(py))
      scaled_residual_forward_kernel<T, S, V>
          <<<grid_size(n / V, 256), 256, 0, cuda_stream()>>>(px, ph, pscale, pkeep, py, n / V, C, per_sample);
    else
      scaled_residual_forward_kernel<T, S, 1>
          <<<grid_size(n, 256), 256, 0, cuda_stream()>>>(px, ph, pscale, pkeep, py, n, C, per_sample);
    CUDA_CHECK_LAUNCH();
  });
  return y;
}

std::optional<std::pair<Tensor, Tensor>> CudaBackend::scaled_residual_add_backward(const Tensor& grad_y,
                                                                                   const Tensor& h,
                                                                                   const Tensor& scale,
                                                                                   const Tensor& keep) {
  using namespace cuda;
  if (!applies(grad_y, h, scale, keep)) return std::nullopt;
  const int64_t n = h.numel(), C = h.size(-1), rows = n / std::max<int64_t>(C, 1);
  Tensor grad_h = empty(h.shape(), h.dtype()), grad_scale = empty({C}, scale.dtype());
  if (n == 0) {
    grad_scale.fill_(0.0);
    return std::make_pair(grad_h, grad_scale);
  }
  // Parts of the rows so that the column tiles x parts fill the GPU (about 4 blocks per SM).
  const int64_t tiles = (C + 31) / 32;
  const int64_t target = static_cast<int64_t>(cuda_context().sm_count) * 4;
  const int parts =
      static_cast<int>(std::clamp<int64_t>((target + tiles - 1) / tiles, 1, std::max<int64_t>(1, rows / 64)));
  const int64_t rows_per_part = (rows + parts - 1) / parts;
  Tensor part_sums = empty({parts, C}, DType::f32);
  dispatch(h.dtype(), scale.dtype(), [&](auto t, auto s) {
    using T = decltype(t);
    using S = decltype(s);
    const dim3 block(32, kRowStrides), grid(static_cast<unsigned>(tiles), static_cast<unsigned>(parts));
    scaled_residual_backward_kernel<T, S><<<grid, block, 0, cuda_stream()>>>(
        static_cast<const T*>(grad_y.raw_data()), static_cast<const T*>(h.raw_data()),
        static_cast<const S*>(scale.raw_data()),
        keep.defined() ? static_cast<const T*>(keep.raw_data()) : nullptr, static_cast<T*>(grad_h.raw_data()),
        static_cast<float*>(part_sums.raw_data()), rows, rows_per_part, C, rows / h.size(0));
    CUDA_CHECK_LAUNCH();
    sum_column_parts<S><<<static_cast<unsigned>((C + 255) / 256), 256, 0, cuda_stream()>>>(
        static_cast<const float*>(part_sums.raw_data()), parts, C, static_cast<S*>(grad_scale.raw_data()));
    CUDA_CHECK_LAUNCH();
  });
  return std::make_pair(grad_h, grad_scale);
}

}  // namespace trainer
