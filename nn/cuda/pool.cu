// 2-D max and average pooling and global average pooling with the CPU backend's (PyTorch's)
// semantics. Inputs are read through their strides; outputs keep the input's memory format, so
// channels-last activations stay channels-last. Max-pool backward scatters with atomics (the kernel
// geometry is not passed to it); indices outside the input plane are skipped, not reported, since a
// check would stall the stream. Avg-pool backward gathers, so its sums are deterministic.
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

// Adds each output gradient into the input element its index points at (atomics: windows may overlap).
template <class scalar_t, class acc>
void scatter_max_grads(int64_t n, int64_t C, int64_t H, int64_t W, int64_t OH, int64_t OW, bool cl,
                       const scalar_t* pg, Strides4 sg, const int64_t* pi, Strides4 si, acc* pd,
                       Strides4 sd) {
  for_each(n, [=] __device__(int64_t i) {
    const Nchw o = unravel(i, C, OH, OW, cl);
    const int64_t idx = pi[o.n * si.n + o.c * si.c + o.h * si.h + o.w * si.w];
    if (idx < 0 || idx >= H * W) return;
    atomicAdd(pd + o.n * sd.n + o.c * sd.c + (idx / W) * sd.h + (idx % W) * sd.w,
              static_cast<acc>(to_acc(pg[o.n * sg.n + o.c * sg.c + o.h * sg.h + o.w * sg.w])));
  });
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
  Tensor y = empty(out_shape, x.dtype(), f), indices = empty(out_shape, DType::i64, f);
  const Strides4 sx = strides4(x);
  CUDA_DISPATCH_FLOAT(x.dtype(), "max_pool2d", [&] {
    using acc = acc_t<scalar_t>;
    const scalar_t* px = static_cast<const scalar_t*>(x.raw_data());
    scalar_t* py = static_cast<scalar_t*>(y.raw_data());
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

Tensor CudaBackend::max_pool2d_backward(const Tensor& grad_y, const Tensor& indices, const Shape& x_shape) {
  using namespace cuda;
  check_device(grad_y, "max_pool2d_backward", "grad_y");
  check_device(indices, "max_pool2d_backward", "indices");
  check_4d("max_pool2d_backward", x_shape);
  if (indices.dtype() != DType::i64)
    throw std::invalid_argument("max_pool2d_backward: indices must be i64, got " +
                                std::string(dtype_name(indices.dtype())));
  if (grad_y.dim() != 4 || grad_y.shape() != indices.shape() || grad_y.size(0) != x_shape[0] ||
      grad_y.size(1) != x_shape[1])
    throw std::invalid_argument("max_pool2d_backward: grad_y " + shape_str(grad_y.shape()) + " and indices " +
                                shape_str(indices.shape()) + " do not match input " + shape_str(x_shape));
  const bool cl = is_channels_last(grad_y);
  const MemoryFormat f = cl ? MemoryFormat::channels_last : MemoryFormat::contiguous;
  const DType dtype = grad_y.dtype();
  check_floating(dtype, "max_pool2d_backward");
  // Half types accumulate in an f32 buffer, converted at the end. Deterministic mode accumulates
  // f32/f16/bf16 in f64: overlapping windows add a few float values into one element, and their sum
  // in f64 is exact (whatever the order the atomics run in) unless the values span over 2^27.
  const DType acc_dtype = dtype == DType::f64 || cuda_deterministic() ? DType::f64 : DType::f32;
  Tensor acc_buf = empty(x_shape, acc_dtype, f);
  acc_buf.zero_();
  const Strides4 sg = strides4(grad_y), si = strides4(indices), sd = strides4(acc_buf);
  const int64_t C = x_shape[1], H = x_shape[2], W = x_shape[3], OH = grad_y.size(2), OW = grad_y.size(3);
  CUDA_DISPATCH_FLOAT(dtype, "max_pool2d_backward", [&] {
    const scalar_t* pg = static_cast<const scalar_t*>(grad_y.raw_data());
    const int64_t* pi = static_cast<const int64_t*>(indices.raw_data());
    if (acc_dtype == DType::f64)
      scatter_max_grads(grad_y.numel(), C, H, W, OH, OW, cl, pg, sg, pi, si,
                        static_cast<double*>(acc_buf.raw_data()), sd);
    else
      scatter_max_grads(grad_y.numel(), C, H, W, OH, OW, cl, pg, sg, pi, si,
                        static_cast<float*>(acc_buf.raw_data()), sd);
  });
  return acc_dtype == dtype ? acc_buf : acc_buf.to(dtype);
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
      // Windows oh cover ih when oh * sh - ph <= ih < oh * sh - ph + kh.
      const int64_t oh0 = max(int64_t{0}, (x.h + g.ph - g.kh + g.sh) / g.sh),
                    oh1 = min(g.oh, (x.h + g.ph) / g.sh + 1);
      const int64_t ow0 = max(int64_t{0}, (x.w + g.pw - g.kw + g.sw) / g.sw),
                    ow1 = min(g.ow, (x.w + g.pw) / g.sw + 1);
      const scalar_t* plane = pg + x.n * sg.n + x.c * sg.c;
      acc s = 0;
      for (int64_t oh = oh0; oh < oh1; ++oh)
        for (int64_t ow = ow0; ow < ow1; ++ow) {
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
