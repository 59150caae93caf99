// 2-D max and average pooling and global average pooling with the CPU backend's (PyTorch's)
// semantics. Inputs are read through their strides; outputs keep the input's memory format, so
// channels-last activations stay channels-last. Both backwards gather (each input element sums the
// windows that cover it), so their sums are deterministic. Max-pool indices that point outside their
// window are ignored, not reported, since a check would stall the stream.
//
// Max-pool's indices: i64 positions into H*W (the CPU backend's, PyTorch's), except where the
// channels-last pack kernels run a window of at most 256 elements: there they are u8 offsets within
// the window, row-major from its padded origin (oh * stride - pad, ow * stride - pad). At ResNet-50's
// stem (51M outputs at batch 256) that is 51 MB written and read instead of 411 MB.
#include <algorithm>
#include <initializer_list>
#include <type_traits>

#include "nn/cuda/kernels.cuh"

namespace trainer {
namespace cuda {
namespace {

struct PoolGeometry {
  int64_t n, c, h, w, oh, ow;
  int kh, kw, sh, sw, ph, pw;
  bool ceil_mode, count_include_pad;
};

std::string params_str(const Pool2dParams& p) {
  return "kernel (" + std::to_string(p.kernel_h) + ", " + std::to_string(p.kernel_w) + "), stride (" +
         std::to_string(p.stride_h) + ", " + std::to_string(p.stride_w) + "), padding (" +
         std::to_string(p.pad_h) + ", " + std::to_string(p.pad_w) + ")" + (p.ceil_mode ? ", ceil_mode" : "");
}

PoolGeometry make_geometry(const char* op, const Shape& x, const Pool2dParams& p) {
  auto fail = [&](const std::string& why) {
    throw std::invalid_argument(std::string(op) + ": " + why + " (input " + shape_str(x) + ", " +
                                params_str(p) + ")");
  };
  if (x.size() != 4) fail("input must be 4-D [N, C, H, W]");
  if (p.kernel_h < 1 || p.kernel_w < 1) fail("kernel size must be at least 1");
  if (p.stride_h < 1 || p.stride_w < 1) fail("stride must be at least 1");
  if (p.pad_h < 0 || p.pad_w < 0) fail("padding must be non-negative");
  if (2 * p.pad_h > p.kernel_h || 2 * p.pad_w > p.kernel_w)
    fail("padding must be at most half the kernel size");
  if (x[2] + 2 * p.pad_h < p.kernel_h || x[3] + 2 * p.pad_w < p.kernel_w)
    fail("the kernel is larger than the padded input");
  PoolGeometry g{x[0],
                 x[1],
                 x[2],
                 x[3],
                 pool_output_size(x[2], p.kernel_h, p.stride_h, p.pad_h, p.ceil_mode),
                 pool_output_size(x[3], p.kernel_w, p.stride_w, p.pad_w, p.ceil_mode),
                 p.kernel_h,
                 p.kernel_w,
                 p.stride_h,
                 p.stride_w,
                 p.pad_h,
                 p.pad_w,
                 p.ceil_mode,
                 p.count_include_pad};
  if (g.oh < 1 || g.ow < 1)
    fail("output would be " + std::to_string(g.oh) + "x" + std::to_string(g.ow) + "; the input is too small");
  return g;
}

void check_4d(const char* op, const Shape& shape) {
  if (shape.size() != 4)
    throw std::invalid_argument(std::string(op) + ": input must be 4-D [N, C, H, W], got " +
                                shape_str(shape));
}

// The logical (n, c, h, w) of element i of a dense [N, C, H, W] tensor in memory order.
struct Nchw {
  int64_t n, c, h, w;
};
__device__ __forceinline__ Nchw unravel(int64_t i, int64_t C, int64_t H, int64_t W, bool channels_last) {
  Nchw r;
  if (channels_last) {
    r.c = i % C, i /= C, r.w = i % W, i /= W, r.h = i % H, r.n = i / H;
  } else {
    r.w = i % W, i /= W, r.h = i % H, i /= H, r.c = i % C, r.n = i / C;
  }
  return r;
}

struct Strides4 {
  int64_t n, c, h, w;
};
Strides4 strides4(const Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2), t.stride(3)}; }

bool is_channels_last(const Tensor& t) { return dense_format(t) == MemoryFormat::channels_last; }

// PyTorch's avg-pool window: clipped to the padded input for the divisor, to the input for the sum.
struct AvgWindow {
  int64_t h0, h1, w0, w1, divisor;
};
__device__ __forceinline__ AvgWindow avg_window(const PoolGeometry& g, int64_t oh, int64_t ow) {
  int64_t h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
  int64_t h1 = min(h0 + g.kh, g.h + g.ph), w1 = min(w0 + g.kw, g.w + g.pw);
  const int64_t padded = (h1 - h0) * (w1 - w0);
  h0 = max(h0, int64_t{0}), w0 = max(w0, int64_t{0});
  h1 = min(h1, g.h), w1 = min(w1, g.w);
  return {h0, h1, w0, w1, g.count_include_pad ? padded : (h1 - h0) * (w1 - w0)};
}

// The output windows [begin, end) along one axis that cover input position i: window o covers
// [o * stride - pad, o * stride - pad + kernel). Both backwards gather over them.
template <class I>
struct Span {
  I begin, end;
};
template <class I>
__device__ __forceinline__ Span<I> covering_windows(I i, I kernel, I stride, I pad, I outputs) {
  return {max(I{0}, (i + pad - kernel + stride) / stride), min(outputs, (i + pad) / stride + 1)};
}

// The index window (oh, ow) stores when it picks input (ih, iw): the input's position in H*W (i64)
// or its offset within the window (u8). Comparing against it tells whether the window picked it.
template <class I, class T>
__device__ __forceinline__ I picked_index(T ih, T iw, T oh, T ow, const PoolGeometry& g) {
  if constexpr (std::is_same_v<I, uint8_t>)
    return static_cast<I>((ih - oh * g.sh + g.ph) * g.kw + (iw - ow * g.sw + g.pw));
  else
    return static_cast<I>(ih * g.w + iw);
}

// Each input element sums the gradients of the windows that cover it and picked it (at most
// ceil(kh/sh) * ceil(kw/sw) windows), in a fixed order: deterministic, no zeroing pass, no atomics,
// and the result is written in the gradient's own type.
template <class scalar_t, class I>
void gather_max_grads(int64_t n, const PoolGeometry& g, bool cl, const scalar_t* pg, Strides4 sg, const I* pi,
                      Strides4 si, scalar_t* pd) {
  for_each(n, [=] __device__(int64_t i) {
    using acc = acc_t<scalar_t>;
    const Nchw x = unravel(i, g.c, g.h, g.w, cl);
    const Span<int64_t> rows = covering_windows<int64_t>(x.h, g.kh, g.sh, g.ph, g.oh),
                        cols = covering_windows<int64_t>(x.w, g.kw, g.sw, g.pw, g.ow);
    const int64_t gi = x.n * sg.n + x.c * sg.c, ii = x.n * si.n + x.c * si.c;
    acc sum = 0;
    for (int64_t oh = rows.begin; oh < rows.end; ++oh)
      for (int64_t ow = cols.begin; ow < cols.end; ++ow)
        if (pi[ii + oh * si.h + ow * si.w] == picked_index<I>(x.h, x.w, oh, ow, g))
          sum += to_acc(pg[gi + oh * sg.h + ow * sg.w]);
    pd[i] = store<scalar_t>(sum);
  });
}

// Channels-last max pooling with a thread per 16 bytes of one pixel's channels (8 bf16 values): the
// index arithmetic is paid once per pack, in 32 bits within an image, and loads and stores are
// 16 bytes wide. One element per thread with 64-bit divisions cost more than the memory traffic at
// ResNet-50's stem (205M input elements at batch 256): 3.2 ms a step against 0.8 for the old scatter.
// Needs dense channels-last tensors, C a multiple of the pack and 16-byte aligned buffers.
template <class scalar_t>
bool max_pool_vec_applies(const PoolGeometry& g, std::initializer_list<const Tensor*> tensors) {
  if (g.n == 0 || g.c == 0 || g.c % Pack16<scalar_t>::kSize != 0 || g.h * g.w * g.c > (int64_t{1} << 30))
    return false;  // empty tensors go to the per-element kernels, which launch nothing
  for (const Tensor* t : tensors)
    if (!t->is_contiguous(MemoryFormat::channels_last) || !aligned16(t->raw_data())) return false;
  return true;
}

struct VecLaunch {
  dim3 grid;
  static constexpr int kThreads = 256;
};
VecLaunch vec_launch(int64_t per_image, int64_t images) {
  return {dim3(static_cast<unsigned>(
                   std::min<int64_t>((per_image + VecLaunch::kThreads - 1) / VecLaunch::kThreads, 1 << 16)),
               static_cast<unsigned>(std::min<int64_t>(images, 65535)))};
}

template <class scalar_t, class I>
__global__ void max_pool_cl_vec_kernel(PoolGeometry g, const scalar_t* px, scalar_t* py, I* pi) {
  using acc = acc_t<scalar_t>;
  using Pack = Pack16<scalar_t>;
  constexpr int V = Pack::kSize;
  const unsigned packs = static_cast<unsigned>(g.c / V),
                 per_image = static_cast<unsigned>(g.oh * g.ow) * packs;
  const int H = static_cast<int>(g.h), W = static_cast<int>(g.w), OW = static_cast<int>(g.ow);
  for (int64_t n = blockIdx.y; n < g.n; n += gridDim.y)
    for (unsigned v = blockIdx.x * blockDim.x + threadIdx.x; v < per_image; v += gridDim.x * blockDim.x) {
      const unsigned pixel = v / packs, c0 = (v - pixel * packs) * V;
      const int oh = static_cast<int>(pixel) / OW, ow = static_cast<int>(pixel) - oh * OW;
      const int top = oh * g.sh - g.ph, left = ow * g.sw - g.pw;  // the window's padded origin
      const int h0 = max(top, 0), h1 = min(top + g.kh, H), w0 = max(left, 0), w1 = min(left + g.kw, W);
      // The index each element would store: the same encoding the backward compares against. (An i64
      // position fits an int here: max_pool_vec_applies keeps an image under 2^30 elements.)
      const auto index_of = [&](int ih, int iw) {
        return static_cast<int>(picked_index<I>(ih, iw, oh, ow, g));
      };
      acc best[V];
      int best_i[V];
      const int first = index_of(h0, w0);
#pragma unroll
      for (int j = 0; j < V; ++j) best[j] = -INFINITY, best_i[j] = first;
      const scalar_t* image = px + n * g.h * g.w * g.c + c0;
      for (int ih = h0; ih < h1; ++ih)
        for (int iw = w0; iw < w1; ++iw) {
          const Pack in = *reinterpret_cast<const Pack*>(image + (static_cast<int64_t>(ih) * W + iw) * g.c);
          const int here = index_of(ih, iw);
#pragma unroll
          for (int j = 0; j < V; ++j) {
            const acc x = to_acc(in.v[j]);
            if (x > best[j] || isnan(x)) best[j] = x, best_i[j] = here;  // NaN wins, like PyTorch
          }
        }
      const int64_t out = (n * g.oh * g.ow + pixel) * g.c + c0;
      Pack y;
#pragma unroll
      for (int j = 0; j < V; ++j) y.v[j] = store<scalar_t>(best[j]), pi[out + j] = static_cast<I>(best_i[j]);
      *reinterpret_cast<Pack*>(py + out) = y;
    }
}

// Each input element sums the gradients of the windows that cover it and picked it, in a fixed order.
template <class scalar_t, class I>
__global__ void max_pool_backward_cl_vec_kernel(PoolGeometry g, const scalar_t* pg, const I* pi,
                                                scalar_t* pd) {
  using acc = acc_t<scalar_t>;
  using Pack = Pack16<scalar_t>;
  constexpr int V = Pack::kSize;
  const unsigned packs = static_cast<unsigned>(g.c / V), per_image = static_cast<unsigned>(g.h * g.w) * packs;
  const int W = static_cast<int>(g.w), OH = static_cast<int>(g.oh), OW = static_cast<int>(g.ow);
  for (int64_t n = blockIdx.y; n < g.n; n += gridDim.y)
    for (unsigned v = blockIdx.x * blockDim.x + threadIdx.x; v < per_image; v += gridDim.x * blockDim.x) {
      const unsigned pixel = v / packs, c0 = (v - pixel * packs) * V;
      const int ih = static_cast<int>(pixel) / W, iw = static_cast<int>(pixel) - ih * W;
      const Span<int> rows = covering_windows(ih, g.kh, g.sh, g.ph, OH),
                      cols = covering_windows(iw, g.kw, g.sw, g.pw, OW);
      acc sum[V];
#pragma unroll
      for (int j = 0; j < V; ++j) sum[j] = 0;
      const int64_t image = n * g.oh * g.ow * g.c + c0;
      for (int oh = rows.begin; oh < rows.end; ++oh)
        for (int ow = cols.begin; ow < cols.end; ++ow) {
          const int64_t at = image + (static_cast<int64_t>(oh) * OW + ow) * g.c;
          const Pack grad = *reinterpret_cast<const Pack*>(pg + at);
          I index[V];
          if constexpr (std::is_same_v<I, uint8_t>) {  // V offsets in one 4- or 8-byte load
            struct alignas(V) Offsets {
              uint8_t v[V];
            };
            const Offsets o = *reinterpret_cast<const Offsets*>(pi + at);
#pragma unroll
            for (int j = 0; j < V; ++j) index[j] = o.v[j];
          } else {
#pragma unroll
            for (int j = 0; j < V; ++j) index[j] = pi[at + j];
          }
          const I target = picked_index<I>(ih, iw, oh, ow, g);
#pragma unroll
          for (int j = 0; j < V; ++j)
            if (index[j] == target) sum[j] += to_acc(grad.v[j]);
        }
      Pack dx;
#pragma unroll
      for (int j = 0; j < V; ++j) dx.v[j] = store<scalar_t>(sum[j]);
      *reinterpret_cast<Pack*>(pd + (n * g.h * g.w + pixel) * g.c + c0) = dx;
    }
}

}  // namespace
}  // namespace cuda

std::pair<Tensor, Tensor> CudaBackend::max_pool2d(const Tensor& x, const Pool2dParams& p) {
  using namespace cuda;
  check_device(x, "max_pool2d", "input");
  const PoolGeometry g = make_geometry("max_pool2d", x.shape(), p);
  const bool cl = is_channels_last(x);
  const MemoryFormat f = cl ? MemoryFormat::channels_last : MemoryFormat::contiguous;
  const Shape out_shape{g.n, g.c, g.oh, g.ow};
  Tensor y = empty(out_shape, x.dtype(), f), indices;
  const Strides4 sx = strides4(x);
  CUDA_DISPATCH_FLOAT(x.dtype(), "max_pool2d", [&] {
    using acc = acc_t<scalar_t>;
    const scalar_t* px = static_cast<const scalar_t*>(x.raw_data());
    scalar_t* py = static_cast<scalar_t*>(y.raw_data());
    if (cl && max_pool_vec_applies<scalar_t>(g, {&x, &y})) {
      const bool offsets = g.kh * g.kw <= 256;
      indices = empty(out_shape, offsets ? DType::u8 : DType::i64, f);
      const VecLaunch l = vec_launch(g.oh * g.ow * g.c / Pack16<scalar_t>::kSize, g.n);
      if (offsets)
        max_pool_cl_vec_kernel<<<l.grid, VecLaunch::kThreads, 0, cuda_stream()>>>(
            g, px, py, static_cast<uint8_t*>(indices.raw_data()));
      else
        max_pool_cl_vec_kernel<<<l.grid, VecLaunch::kThreads, 0, cuda_stream()>>>(
            g, px, py, static_cast<int64_t*>(indices.raw_data()));
      CUDA_CHECK_LAUNCH();
      return;
    }
    indices = empty(out_shape, DType::i64, f);
    int64_t* pi = static_cast<int64_t*>(indices.raw_data());
    for_each(y.numel(), [=] __device__(int64_t i) {
      const Nchw o = unravel(i, g.c, g.oh, g.ow, cl);
      const int64_t h0 = max(o.h * g.sh - g.ph, int64_t{0}), h1 = min(o.h * g.sh - g.ph + g.kh, g.h);
      const int64_t w0 = max(o.w * g.sw - g.pw, int64_t{0}), w1 = min(o.w * g.sw - g.pw + g.kw, g.w);
      const scalar_t* plane = px + o.n * sx.n + o.c * sx.c;
      acc best = -INFINITY;
      int64_t best_i = h0 * g.w + w0;
      for (int64_t ih = h0; ih < h1; ++ih)
        for (int64_t iw = w0; iw < w1; ++iw) {
          const acc v = to_acc(plane[ih * sx.h + iw * sx.w]);
          if (v > best || isnan(v)) {  // NaN wins, like PyTorch
            best = v;
            best_i = ih * g.w + iw;
          }
        }
      py[i] = store<scalar_t>(best);
      pi[i] = best_i;
    });
  });
  return {y, indices};
}

namespace cuda {
namespace {

// max_pool2d_backward for one gradient type and one index type (i64 positions or u8 offsets).
template <class scalar_t, class I>
void max_pool_backward(const PoolGeometry& g, bool cl, const Tensor& grad_y, const Tensor& indices,
                       Tensor& dx) {
  const scalar_t* pg = static_cast<const scalar_t*>(grad_y.raw_data());
  const I* pi = static_cast<const I*>(indices.raw_data());
  scalar_t* pd = static_cast<scalar_t*>(dx.raw_data());
  if (cl && max_pool_vec_applies<scalar_t>(g, {&grad_y, &indices, &dx})) {
    const VecLaunch l = vec_launch(g.h * g.w * g.c / Pack16<scalar_t>::kSize, g.n);
    max_pool_backward_cl_vec_kernel<<<l.grid, VecLaunch::kThreads, 0, cuda_stream()>>>(g, pg, pi, pd);
    CUDA_CHECK_LAUNCH();
    return;
  }
  gather_max_grads(dx.numel(), g, cl, pg, strides4(grad_y), pi, strides4(indices), pd);
}

}  // namespace
}  // namespace cuda

Tensor CudaBackend::max_pool2d_backward(const Tensor& grad_y, const Tensor& indices, const Shape& x_shape,
                                        const Pool2dParams& p) {
  using namespace cuda;
  check_device(grad_y, "max_pool2d_backward", "grad_y");
  check_device(indices, "max_pool2d_backward", "indices");
  const PoolGeometry g = make_geometry("max_pool2d_backward", x_shape, p);
  const bool offsets = indices.dtype() == DType::u8;
  if (!offsets && indices.dtype() != DType::i64)
    throw std::invalid_argument("max_pool2d_backward: indices must be i64 (or u8 window offsets), got " +
                                std::string(dtype_name(indices.dtype())));
  if (offsets && g.kh * g.kw > 256)
    throw std::invalid_argument(
        "max_pool2d_backward: u8 window offsets need a window of at most 256 elements");
  if (grad_y.shape() != indices.shape() || grad_y.shape() != Shape{g.n, g.c, g.oh, g.ow})
    throw std::invalid_argument("max_pool2d_backward: grad_y " + shape_str(grad_y.shape()) + " and indices " +
                                shape_str(indices.shape()) + " do not match input " + shape_str(x_shape) +
                                " pooled with " + params_str(p));
  const bool cl = is_channels_last(grad_y);
  const DType dtype = grad_y.dtype();
  check_floating(dtype, "max_pool2d_backward");
  Tensor dx = empty(x_shape, dtype, cl ? MemoryFormat::channels_last : MemoryFormat::contiguous);
  CUDA_DISPATCH_FLOAT(dtype, "max_pool2d_backward", [&] {
    if (offsets)
      max_pool_backward<scalar_t, uint8_t>(g, cl, grad_y, indices, dx);
    else
      max_pool_backward<scalar_t, int64_t>(g, cl, grad_y, indices, dx);
  });
  return dx;
}

Tensor CudaBackend::avg_pool2d(const Tensor& x, const Pool2dParams& p) {
  using namespace cuda;
  check_device(x, "avg_pool2d", "input");
  const PoolGeometry g = make_geometry("avg_pool2d", x.shape(), p);
  const bool cl = is_channels_last(x);
  Tensor y =
      empty({g.n, g.c, g.oh, g.ow}, x.dtype(), cl ? MemoryFormat::channels_last : MemoryFormat::contiguous);
  const Strides4 sx = strides4(x);
  CUDA_DISPATCH_FLOAT(x.dtype(), "avg_pool2d", [&] {
    using acc = acc_t<scalar_t>;
    const scalar_t* px = static_cast<const scalar_t*>(x.raw_data());
    scalar_t* py = static_cast<scalar_t*>(y.raw_data());
    for_each(y.numel(), [=] __device__(int64_t i) {
      const Nchw o = unravel(i, g.c, g.oh, g.ow, cl);
      const AvgWindow win = avg_window(g, o.h, o.w);
      const scalar_t* plane = px + o.n * sx.n + o.c * sx.c;
      acc s = 0;
      for (int64_t ih = win.h0; ih < win.h1; ++ih)
        for (int64_t iw = win.w0; iw < win.w1; ++iw) s += to_acc(plane[ih * sx.h + iw * sx.w]);
      py[i] = store<scalar_t>(win.divisor > 0 ? s / static_cast<acc>(win.divisor) : acc(0));
    });
  });
  return y;
}

Tensor CudaBackend::avg_pool2d_backward(const Tensor& grad_y, const Shape& x_shape, const Pool2dParams& p) {
  using namespace cuda;
  check_device(grad_y, "avg_pool2d_backward", "grad_y");
  const PoolGeometry g = make_geometry("avg_pool2d_backward", x_shape, p);
  if (grad_y.shape() != Shape{g.n, g.c, g.oh, g.ow})
    throw std::invalid_argument("avg_pool2d_backward: grad_y has shape " + shape_str(grad_y.shape()) +
                                ", the pooling's output shape is " + shape_str({g.n, g.c, g.oh, g.ow}));
  const bool cl = is_channels_last(grad_y);
  Tensor dx = empty(x_shape, grad_y.dtype(), cl ? MemoryFormat::channels_last : MemoryFormat::contiguous);
  const Strides4 sg = strides4(grad_y);
  CUDA_DISPATCH_FLOAT(grad_y.dtype(), "avg_pool2d_backward", [&] {
    using acc = acc_t<scalar_t>;
    const scalar_t* pg = static_cast<const scalar_t*>(grad_y.raw_data());
    scalar_t* pd = static_cast<scalar_t*>(dx.raw_data());
    for_each(dx.numel(), [=] __device__(int64_t i) {
      const Nchw x = unravel(i, g.c, g.h, g.w, cl);
      const Span<int64_t> rows = covering_windows<int64_t>(x.h, g.kh, g.sh, g.ph, g.oh),
                          cols = covering_windows<int64_t>(x.w, g.kw, g.sw, g.pw, g.ow);
      const scalar_t* plane = pg + x.n * sg.n + x.c * sg.c;
      acc s = 0;
      for (int64_t oh = rows.begin; oh < rows.end; ++oh)
        for (int64_t ow = cols.begin; ow < cols.end; ++ow) {
          const AvgWindow win = avg_window(g, oh, ow);
          if (win.divisor <= 0 || x.h < win.h0 || x.h >= win.h1 || x.w < win.w0 || x.w >= win.w1) continue;
          s += to_acc(plane[oh * sg.h + ow * sg.w]) / static_cast<acc>(win.divisor);
        }
      pd[i] = store<scalar_t>(s);
    });
  });
  return dx;
}

Tensor CudaBackend::global_avg_pool(const Tensor& x) {
  using namespace cuda;
  check_device(x, "global_avg_pool", "input");
  check_4d("global_avg_pool", x.shape());
  const int64_t C = x.size(1), H = x.size(2), W = x.size(3), hw = H * W, planes = x.size(0) * C;
  if (hw == 0) throw std::invalid_argument("global_avg_pool: empty planes in input " + shape_str(x.shape()));
  Tensor y = empty({x.size(0), C}, x.dtype());
  const Strides4 sx = strides4(x);
  CUDA_DISPATCH_FLOAT(x.dtype(), "global_avg_pool", [&] {
    const scalar_t* px = static_cast<const scalar_t*>(x.raw_data());
    scalar_t* py = static_cast<scalar_t*>(y.raw_data());
    // Summing in double like the CPU. Channels-last: a thread per plane, so that neighbouring threads
    // read neighbouring channels (a warp per plane read one element per 32-byte sector there: 60 us
    // for resnet18's last 4 MB at batch 512). Otherwise a warp per plane, reading along the row.
    if (sx.c == 1 && C > 1) {
      for_each(planes, [=] __device__(int64_t plane) {
        const scalar_t* base = px + (plane / C) * sx.n + (plane % C);
        double s = 0.0;
        for (int64_t k = 0; k < hw; ++k) s += to_acc(base[(k / W) * sx.h + (k % W) * sx.w]);
        py[plane] = from_acc<scalar_t>(s / static_cast<double>(hw));
      });
      return;
    }
    for_each(planes * 32, [=] __device__(int64_t t) {
      const int64_t plane = t / 32;
      const int lane = static_cast<int>(t % 32);
      const scalar_t* base = px + (plane / C) * sx.n + (plane % C) * sx.c;
      double s = 0.0;
      for (int64_t k = lane; k < hw; k += 32) s += to_acc(base[(k / W) * sx.h + (k % W) * sx.w]);
      s = warp_sum(s);
      if (lane == 0) py[plane] = from_acc<scalar_t>(s / static_cast<double>(hw));
    });
  });
  return y;
}

Tensor CudaBackend::global_avg_pool_backward(const Tensor& grad_y, const Shape& x_shape,
                                             MemoryFormat format) {
  using namespace cuda;
  check_device(grad_y, "global_avg_pool_backward", "grad_y");
  check_4d("global_avg_pool_backward", x_shape);
  if (grad_y.shape() != Shape{x_shape[0], x_shape[1]})
    throw std::invalid_argument("global_avg_pool_backward: grad_y has shape " + shape_str(grad_y.shape()) +
                                ", expected [N, C] for input " + shape_str(x_shape));
  const int64_t C = x_shape[1], hw = x_shape[2] * x_shape[3];
  const int64_t sn = grad_y.stride(0), sc = grad_y.stride(1);
  const bool cl = format == MemoryFormat::channels_last;
  Tensor dx = empty(x_shape, grad_y.dtype(), format);
  CUDA_DISPATCH_FLOAT(grad_y.dtype(), "global_avg_pool_backward", [&] {
    using acc = acc_t<scalar_t>;
    const scalar_t* pg = static_cast<const scalar_t*>(grad_y.raw_data());
    scalar_t* pd = static_cast<scalar_t*>(dx.raw_data());
    const acc inv = acc(1) / static_cast<acc>(hw);
    for_each(dx.numel(), [=] __device__(int64_t i) {
      // Element i's sample and channel: memory is [N, C, H*W], or [N, H*W, C] channels-last.
      const int64_t n = i / (hw * C), c = cl ? i % C : (i / hw) % C;
      pd[i] = store<scalar_t>(to_acc(pg[n * sn + c * sc]) * inv);
    });
  });
  return dx;
}

}  // namespace trainer
