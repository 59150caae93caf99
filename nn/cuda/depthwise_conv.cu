// Depthwise convolution kernels in channels-last memory: see depthwise_conv.h for when and why.
//
// Every kernel gives a thread V adjacent channels (one 8-byte load or store: 4 half or 2 f32 values;
// one channel where C or a pointer does not allow that) and kTileW adjacent output columns of one row.
// The thread loads each input row segment it needs once (kTileW + K - 1 vectors) and uses every
// vector for up to K taps of the kTileW outputs: a 7x7 kernel does 16 FMAs per 8-byte load in half
// precision (8 in f32), so the kernels should run near the FMA rate rather than wait on L1. The lanes of a
// warp take adjacent channel vectors first, so their loads are contiguous runs of a pixel row.
//   - forward and input gradient: a block's weights (its slice of channels, all K*K taps) sit in
//     shared memory as f32; the input gradient is the forward of grad_y with the kernel rotated by 180
//     degrees (padding K/2 on both sides makes that the same geometry).
//   - weight gradient: a block takes a fixed run of (n, row) output rows and one channel slice; its
//     threads are (channel vector, ky) pairs, each summing its K taps x V channels over the rows in
//     registers, then writing them to the block's f32 partial row. A second kernel adds the partial
//     rows in a fixed order. The partition depends on the shapes only, so results are bitwise
//     reproducible on any GPU.
#include <algorithm>
#include <atomic>
#include <initializer_list>
#include <type_traits>

#include "nn/cuda/depthwise_conv.h"
#include "nn/cuda/kernels.cuh"

namespace trainer::cuda {
namespace {

constexpr int kTileW = 8;               // output columns a thread computes
constexpr int kMaxSliceGroups = 32;     // channel vectors a block covers (a warp's width)
constexpr int kMaxSliceChannels = 128;  // kMaxSliceGroups * the widest vector (4 half values)
constexpr int kMaxKernel = 7;
constexpr int kThreads = 256;         // forward and input gradient
constexpr int kMaxBlocks = 1024;      // forward: grid-stride beyond, so each block loads its weights once
constexpr int kPartialBlocks = 1024;  // weight gradient: about this many partial rows...
constexpr int kMinPixelsPerPartial = 256;  // ...but each from at least this many pixels per channel

std::atomic<int64_t> g_calls{0};

// V adjacent channels of one pixel, moved in one load or store.
template <class T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

struct Geometry {
  int n, h, w, c;    // x [N, H, W, C] in memory
  int slice_groups;  // channel vectors a block covers
  int slices;        // blocks across the channels
  int tiles;         // kTileW-wide column tiles per row
};

Geometry geometry_of(const Shape& x_shape, int v) {
  Geometry g;
  g.n = static_cast<int>(x_shape[0]), g.c = static_cast<int>(x_shape[1]);
  g.h = static_cast<int>(x_shape[2]), g.w = static_cast<int>(x_shape[3]);
  const int groups = g.c / v;
  g.slices = (groups + kMaxSliceGroups - 1) / kMaxSliceGroups;
  g.slice_groups = (groups + g.slices - 1) / g.slices;  // balanced: 48 groups are 2 x 24, not 32 + 16
  g.tiles = (g.w + kTileW - 1) / kTileW;
  return g;
}

template <class T, int V>
__device__ __forceinline__ void load_vec(const T* p, bool inside, float (&out)[V]) {
  if (!inside) {
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = 0.0f;
    return;
  }
  const Vec<T, V> in = *reinterpret_cast<const Vec<T, V>*>(p);
#pragma unroll
  for (int i = 0; i < V; ++i) out[i] = to_acc(in.v[i]);
}

template <class T, int V>
__device__ __forceinline__ void store_vec(T* p, const float (&in)[V]) {
  Vec<T, V> out;
#pragma unroll
  for (int i = 0; i < V; ++i) out.v[i] = from_f<T>(in[i]);
  *reinterpret_cast<Vec<T, V>*>(p) = out;
}

// The heart of every kernel: the kTileW + K - 1 input vectors around output columns [x0, x0 + kTileW)
// of one row, each loaded once (zeros outside the row), and f(t, kx, in) for every output column t
// that tap kx reads it for.
template <class T, int V, int K, class F>
__device__ __forceinline__ void for_each_tap_of_row(const Geometry& g, const T* row, int x0, F&& f) {
#pragma unroll
  for (int j = 0; j < kTileW + K - 1; ++j) {
    const int ix = x0 + j - K / 2;
    float in[V];
    load_vec<T, V>(row + static_cast<int64_t>(ix) * g.c, ix >= 0 && ix < g.w, in);
#pragma unroll
    for (int t = 0; t < kTileW; ++t) {
      const int kx = j - t;
      if (kx >= 0 && kx < K) f(t, kx, in);
    }
  }
}

// y = conv(x, w) + bias for one block's channel slice; w rotated by 180 degrees when `rotate` (the
// input gradient: x is then grad_y and y is dx).
template <class T, int V, int K>
__global__ void __launch_bounds__(kThreads)
    depthwise_forward_kernel(Geometry g, const T* x, const T* w, const T* bias, bool rotate, T* y) {
  constexpr int P = K / 2;
  __shared__ float weights[K * K * kMaxSliceChannels];  // [tap][channel in slice]
  const int slice_c0 = blockIdx.y * g.slice_groups * V;
  const int slice_c = min(g.slice_groups * V, g.c - slice_c0);
  for (int i = threadIdx.x; i < K * K * slice_c; i += blockDim.x) {
    const int tap = i / slice_c, sc = i - tap * slice_c;
    weights[tap * kMaxSliceChannels + sc] =
        to_acc(w[static_cast<int64_t>(slice_c0 + sc) * K * K + (rotate ? K * K - 1 - tap : tap)]);
  }
  __syncthreads();
  const int items = g.n * g.h * g.tiles * g.slice_groups;
  for (int item = blockIdx.x * blockDim.x + threadIdx.x; item < items; item += gridDim.x * blockDim.x) {
    const int group = item % g.slice_groups, rest = item / g.slice_groups;
    const int tile = rest % g.tiles, row = rest / g.tiles;  // row: n * H + oy
    const int sc0 = group * V, c0 = slice_c0 + sc0;
    if (c0 >= g.c) continue;  // past the last slice's channels
    const int n = row / g.h, oy = row - n * g.h, x0 = tile * kTileW;
    float acc[kTileW][V];
#pragma unroll
    for (int t = 0; t < kTileW; ++t)
#pragma unroll
      for (int i = 0; i < V; ++i) acc[t][i] = bias ? to_acc(bias[c0 + i]) : 0.0f;
#pragma unroll
    for (int ky = 0; ky < K; ++ky) {
      const int iy = oy + ky - P;
      if (iy < 0 || iy >= g.h) continue;
      const T* in_row = x + (static_cast<int64_t>(n) * g.h + iy) * g.w * g.c + c0;
      float wk[K][V];
#pragma unroll
      for (int kx = 0; kx < K; ++kx)
#pragma unroll
        for (int i = 0; i < V; ++i) wk[kx][i] = weights[(ky * K + kx) * kMaxSliceChannels + sc0 + i];
      for_each_tap_of_row<T, V, K>(g, in_row, x0, [&](int t, int kx, const float(&in)[V]) {
#pragma unroll
        for (int i = 0; i < V; ++i) acc[t][i] = fmaf(in[i], wk[kx][i], acc[t][i]);
      });
    }
    T* out_row = y + static_cast<int64_t>(row) * g.w * g.c + c0;
#pragma unroll
    for (int t = 0; t < kTileW; ++t)
      if (x0 + t < g.w) store_vec<T, V>(out_row + static_cast<int64_t>(x0 + t) * g.c, acc[t]);
  }
}

// The partial sums of block (rows, slice): partial[blockIdx.x][tap][c] for the weight, and when
// `with_bias`, partial[blockIdx.x][K*K][c] for the bias (rows of `columns` floats). Thread (group, ky).
template <class T, int V, int K>
__global__ void __launch_bounds__(kMaxSliceGroups* kMaxKernel)
    depthwise_weight_partials_kernel(Geometry g, int rows_per_block, const T* dy, const T* x, bool with_bias,
                                     int64_t columns, float* partial) {
  constexpr int P = K / 2;
  const int group = threadIdx.x % g.slice_groups, ky = threadIdx.x / g.slice_groups;
  const int c0 = (blockIdx.y * g.slice_groups + group) * V;
  if (c0 >= g.c) return;  // past the last slice's channels (no barrier follows)
  const bool sums_bias = with_bias && ky == 0;
  const int r0 = blockIdx.x * rows_per_block, r1 = min(g.n * g.h, r0 + rows_per_block);
  float acc[K][V] = {}, db[V] = {};
  for (int r = r0; r < r1; ++r) {
    const int n = r / g.h, iy = r - n * g.h + ky - P;
    const bool row_inside = iy >= 0 && iy < g.h;
    if (!row_inside && !sums_bias) continue;
    const T* dy_row = dy + static_cast<int64_t>(r) * g.w * g.c + c0;
    const T* x_row = x + (static_cast<int64_t>(n) * g.h + (row_inside ? iy : 0)) * g.w * g.c + c0;
    for (int x0 = 0; x0 < g.w; x0 += kTileW) {
      float d[kTileW][V];
#pragma unroll
      for (int t = 0; t < kTileW; ++t)
        load_vec<T, V>(dy_row + static_cast<int64_t>(x0 + t) * g.c, x0 + t < g.w, d[t]);
      if (sums_bias)
#pragma unroll
        for (int t = 0; t < kTileW; ++t)
#pragma unroll
          for (int i = 0; i < V; ++i) db[i] += d[t][i];
      if (!row_inside) continue;
      for_each_tap_of_row<T, V, K>(g, x_row, x0, [&](int t, int kx, const float(&in)[V]) {
#pragma unroll
        for (int i = 0; i < V; ++i) acc[kx][i] = fmaf(d[t][i], in[i], acc[kx][i]);
      });
    }
  }
  float* out = partial + blockIdx.x * columns;
#pragma unroll
  for (int kx = 0; kx < K; ++kx)
#pragma unroll
    for (int i = 0; i < V; ++i) out[static_cast<int64_t>(ky * K + kx) * g.c + c0 + i] = acc[kx][i];
  if (sums_bias)
#pragma unroll
    for (int i = 0; i < V; ++i) out[static_cast<int64_t>(K * K) * g.c + c0 + i] = db[i];
}

constexpr int kSumColumns = 32, kSumRows = 8;  // the partials' sum: a block is 32 columns x 8 row phases

// Column j of partial [chunks, columns] summed over the chunks: lane phase r adds chunks r, r + 8, ...
// in order, then the 8 phase sums are added in order. Columns < taps * C go to dw [C, taps], the rest
// to db [C].
template <class T>
__global__ void __launch_bounds__(kSumColumns* kSumRows)
    depthwise_sum_partials_kernel(const float* partial, int chunks, int64_t columns, int c, int taps, T* dw,
                                  T* db) {
  __shared__ float phase_sums[kSumRows][kSumColumns];
  const int64_t j = blockIdx.x * static_cast<int64_t>(kSumColumns) + threadIdx.x;
  float s = 0.0f;
  if (j < columns)
    for (int k = threadIdx.y; k < chunks; k += kSumRows) s += partial[k * columns + j];
  phase_sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || j >= columns) return;
  float total = 0.0f;
#pragma unroll
  for (int r = 0; r < kSumRows; ++r) total += phase_sums[r][threadIdx.x];
  const int64_t weight_columns = static_cast<int64_t>(taps) * c;
  if (j < weight_columns)
    dw[(j % c) * taps + j / c] = from_f<T>(total);
  else
    db[j - weight_columns] = from_f<T>(total);
}

// Channels per thread: 8 bytes' worth where C and every vector-accessed pointer allow it, else 1.
template <class T>
int vector_width(int64_t c, std::initializer_list<const void*> pointers) {
  constexpr int wide = 8 / sizeof(T);
  if (c % wide != 0) return 1;
  for (const void* p : pointers)
    if (reinterpret_cast<uintptr_t>(p) % (wide * sizeof(T)) != 0) return 1;
  return wide;
}

template <class T, int V, int K>
void launch_forward(const Geometry& g, const T* x, const T* w, const T* bias, bool rotate, T* y) {
  const int64_t items = static_cast<int64_t>(g.n) * g.h * g.tiles * g.slice_groups;
  const int64_t per_slice = (kMaxBlocks + g.slices - 1) / g.slices;
  const dim3 grid(static_cast<unsigned>(std::min((items + kThreads - 1) / kThreads, per_slice)), g.slices);
  depthwise_forward_kernel<T, V, K><<<grid, kThreads, 0, cuda_stream()>>>(g, x, w, bias, rotate, y);
  CUDA_CHECK_LAUNCH();
}

// Runs body(std::integral_constant<int, K>{}) for the kernel size k (3, 5 or 7).
template <class Body>
void with_kernel_size(int64_t k, Body&& body) {
  if (k == 3) return body(std::integral_constant<int, 3>{});
  if (k == 5) return body(std::integral_constant<int, 5>{});
  body(std::integral_constant<int, 7>{});
}

// Runs body(T{}) for the element type of dtype (f32, f16 or bf16: depthwise_conv_applies has checked).
template <class Body>
void with_element_type(DType dtype, Body&& body) {
  if (dtype == DType::f32) return body(float{});
  if (dtype == DType::f16) return body(__half{});
  body(__nv_bfloat16{});
}

// out = conv(in, w, rotated when `rotate`) + bias: the forward, or the input gradient.
Tensor run_forward(const Tensor& in_any, const Tensor& w_any, const Tensor& bias_any, bool rotate) {
  const Tensor in = in_any.contiguous(MemoryFormat::channels_last), w = w_any.contiguous();
  const Tensor bias = bias_any.defined() ? bias_any.contiguous() : Tensor();
  Tensor out = empty(in.shape(), in.dtype(), MemoryFormat::channels_last);
  with_element_type(in.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(in.raw_data());
    const T* pw = static_cast<const T*>(w.raw_data());
    const T* pb = bias.defined() ? static_cast<const T*>(bias.raw_data()) : nullptr;
    T* py = static_cast<T*>(out.raw_data());
    const int v = vector_width<T>(in.size(1), {px, py});
    with_kernel_size(w.size(2), [&](auto k) {
      if (v == 1)
        launch_forward<T, 1, decltype(k)::value>(geometry_of(in.shape(), 1), px, pw, pb, rotate, py);
      else
        launch_forward<T, 8 / sizeof(T), decltype(k)::value>(geometry_of(in.shape(), v), px, pw, pb, rotate,
                                                             py);
    });
  });
  ++g_calls;
  return out;
}

// Rows of (n, y) per partial row: about kPartialBlocks blocks, each from >= kMinPixelsPerPartial pixels.
int rows_per_partial(const Geometry& g) {
  const int64_t rows = static_cast<int64_t>(g.n) * g.h;
  const int64_t by_count = (rows * g.slices + kPartialBlocks - 1) / kPartialBlocks;
  const int64_t by_size = (kMinPixelsPerPartial + g.w - 1) / g.w;
  return static_cast<int>(std::min(rows, std::max(by_count, by_size)));
}

template <class T, int V, int K>
void launch_weight_partials(const Geometry& g, int rows_per_block, int chunks, const T* dy, const T* x,
                            bool with_bias, int64_t columns, float* partial) {
  const dim3 grid(chunks, g.slices);
  depthwise_weight_partials_kernel<T, V, K>
      <<<grid, g.slice_groups * K, 0, cuda_stream()>>>(g, rows_per_block, dy, x, with_bias, columns, partial);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool depthwise_conv_applies(const Tensor& layout_source, const Shape& x, const Shape& w,
                            const Conv2dParams& p) {
  const DType dtype = layout_source.dtype();
  if (dtype != DType::f32 && dtype != DType::f16 && dtype != DType::bf16) return false;
  if (x.size() != 4 || w.size() != 4) return false;
  const int64_t c = x[1], k = w[2];
  // One channel: an NCHW tensor has channels-last strides too; cuDNN keeps such a layer.
  if (c < 2 || p.groups != c || w[0] != c || w[1] != 1 || w[3] != k) return false;
  if (k != 3 && k != 5 && k != 7) return false;
  if (p.stride_h != 1 || p.stride_w != 1 || p.dilation_h != 1 || p.dilation_w != 1 || p.pad_h != k / 2 ||
      p.pad_w != k / 2)
    return false;
  if (layout_source.suggest_memory_format() != MemoryFormat::channels_last) return false;
  const int64_t numel = x[0] * c * x[2] * x[3];
  return numel > 0 && numel < (int64_t{1} << 30);  // the kernels count rows and work items with int
}

Tensor depthwise_conv_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams&) {
  return run_forward(x, w, bias, false);  // [N, C, H, W], channels-last
}

Tensor depthwise_conv_backward_input(const Tensor& grad_y, const Tensor& w, const Shape&,
                                     const Conv2dParams&) {
  return run_forward(grad_y, w, Tensor(), true);  // [N, C, H, W], channels-last
}

Tensor depthwise_conv_backward_weight(const Tensor& grad_y, const Tensor& x_any, const Shape& w_shape,
                                      const Conv2dParams&, MemoryFormat format, Tensor* grad_bias) {
  const Tensor x = x_any.contiguous(MemoryFormat::channels_last);
  const Tensor dy = grad_y.contiguous(MemoryFormat::channels_last);
  const DType dtype = x.dtype();
  const int64_t c = x.size(1), taps = w_shape[2] * w_shape[3];
  Tensor dw = empty(w_shape, dtype, format);  // [C, 1, K, K]: the same memory order in either format
  if (grad_bias) *grad_bias = empty({c}, dtype);
  with_element_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.raw_data());
    const T* pdy = static_cast<const T*>(dy.raw_data());
    const bool with_bias = grad_bias != nullptr;
    const int v = vector_width<T>(c, {px, pdy});
    const Geometry g = geometry_of(x.shape(), v);
    const int rows_per_block = rows_per_partial(g);
    const int chunks = (g.n * g.h + rows_per_block - 1) / rows_per_block;
    const int64_t columns = taps * c + (with_bias ? c : 0);
    Tensor partial = empty({chunks, columns}, DType::f32);  // [chunks, taps * C (+ C)]
    float* pp = static_cast<float*>(partial.raw_data());
    with_kernel_size(w_shape[2], [&](auto k) {
      if (v == 1)
        launch_weight_partials<T, 1, decltype(k)::value>(g, rows_per_block, chunks, pdy, px, with_bias,
                                                         columns, pp);
      else
        launch_weight_partials<T, 8 / sizeof(T), decltype(k)::value>(g, rows_per_block, chunks, pdy, px,
                                                                     with_bias, columns, pp);
    });
    const dim3 grid(static_cast<unsigned>((columns + kSumColumns - 1) / kSumColumns));
    depthwise_sum_partials_kernel<T><<<grid, dim3(kSumColumns, kSumRows), 0, cuda_stream()>>>(
        pp, chunks, columns, static_cast<int>(c), static_cast<int>(taps), static_cast<T*>(dw.raw_data()),
        grad_bias ? static_cast<T*>(grad_bias->raw_data()) : nullptr);
    CUDA_CHECK_LAUNCH();
  });
  ++g_calls;
  return dw;
}

int64_t depthwise_conv_calls() { return g_calls; }

}  // namespace trainer::cuda
