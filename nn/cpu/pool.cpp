// 2-D max and average pooling and global average pooling on the CPU, with PyTorch's semantics:
// max pool pads with -inf and propagates NaN; avg pool windows are clipped to the padded input
// (ceil_mode windows may overhang it) and divide by the padded or the valid window size.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include "nn/cpu/cpu_backend.h"
#include "nn/cpu/parallel.h"

namespace trainer {
namespace {

struct PoolGeometry {
  int64_t planes;  // N * C
  int64_t h, w, oh, ow;
  Pool2dParams p;
};

std::string params_str(const Pool2dParams& p) {
  return "kernel (" + std::to_string(p.kernel_h) + ", " + std::to_string(p.kernel_w) + "), stride (" +
         std::to_string(p.stride_h) + ", " + std::to_string(p.stride_w) + "), padding (" +
         std::to_string(p.pad_h) + ", " + std::to_string(p.pad_w) + ")" + (p.ceil_mode ? ", ceil_mode" : "");
}

PoolGeometry make_geometry(const char* op, const Shape& x_shape, const Pool2dParams& p) {
  auto fail = [&](const std::string& why) {
    throw std::invalid_argument(std::string(op) + ": " + why + " (input " + shape_str(x_shape) + ", " +
                                params_str(p) + ")");
  };
  if (x_shape.size() != 4) fail("input must be 4-D [N, C, H, W]");
  if (p.kernel_h < 1 || p.kernel_w < 1) fail("kernel size must be at least 1");
  if (p.stride_h < 1 || p.stride_w < 1) fail("stride must be at least 1");
  if (p.pad_h < 0 || p.pad_w < 0) fail("padding must be non-negative");
  if (2 * p.pad_h > p.kernel_h || 2 * p.pad_w > p.kernel_w)
    fail("padding must be at most half the kernel size");
  PoolGeometry g;
  g.p = p;
  g.planes = x_shape[0] * x_shape[1];
  g.h = x_shape[2];
  g.w = x_shape[3];
  // Checked here because pool_output_size's integer division truncates a negative span towards zero.
  if (g.h + 2 * p.pad_h < p.kernel_h || g.w + 2 * p.pad_w < p.kernel_w)
    fail("the kernel is larger than the padded input");
  g.oh = pool_output_size(g.h, p.kernel_h, p.stride_h, p.pad_h, p.ceil_mode);
  g.ow = pool_output_size(g.w, p.kernel_w, p.stride_w, p.pad_w, p.ceil_mode);
  if (g.oh < 1 || g.ow < 1)
    fail("output would be " + std::to_string(g.oh) + "x" + std::to_string(g.ow) + "; the input is too small");
  return g;
}

Shape output_shape(const Shape& x_shape, const PoolGeometry& g) {
  return {x_shape[0], x_shape[1], g.oh, g.ow};
}

void check_grad_shape(const char* op, const Tensor& grad_y, const Shape& expected) {
  if (grad_y.shape() != expected)
    throw std::invalid_argument(std::string(op) + ": grad_y has shape " + shape_str(grad_y.shape()) +
                                ", the pooling's output shape is " + shape_str(expected));
}

// The common 2x2 stride-2 unpadded window, without the general loop's bounds arithmetic.
template <class T>
void max_pool_2x2(const T* x, T* y, int64_t* idx, const PoolGeometry& g) {
  const int64_t hw = g.h * g.w;
  for (int64_t plane = 0; plane < g.planes; ++plane, x += hw)
    for (int64_t oh = 0; oh < g.oh; ++oh)
      for (int64_t ow = 0; ow < g.ow; ++ow, ++y, ++idx) {
        const int64_t i0 = 2 * oh * g.w + 2 * ow;
        const int64_t cand[4] = {i0, i0 + 1, i0 + g.w, i0 + g.w + 1};
        int64_t best_i = cand[0];
        T best = x[best_i];
        for (int k = 1; k < 4; ++k) {
          const T v = x[cand[k]];
          if (v > best || v != v) {  // NaN wins, like PyTorch
            best = v;
            best_i = cand[k];
          }
        }
        *y = best;
        *idx = best_i;
      }
}

template <class T>
void max_pool_forward(const T* x, T* y, int64_t* idx, const PoolGeometry& g) {
  const Pool2dParams& p = g.p;
  if (p.kernel_h == 2 && p.kernel_w == 2 && p.stride_h == 2 && p.stride_w == 2 && p.pad_h == 0 &&
      p.pad_w == 0 && g.oh * 2 <= g.h && g.ow * 2 <= g.w)
    return max_pool_2x2(x, y, idx, g);
  const int64_t hw = g.h * g.w;
  for (int64_t plane = 0; plane < g.planes; ++plane, x += hw) {
    for (int64_t oh = 0; oh < g.oh; ++oh) {
      const int64_t h0 = std::max<int64_t>(oh * p.stride_h - p.pad_h, 0);
      const int64_t h1 = std::min<int64_t>(oh * p.stride_h - p.pad_h + p.kernel_h, g.h);
      for (int64_t ow = 0; ow < g.ow; ++ow, ++y, ++idx) {
        const int64_t w0 = std::max<int64_t>(ow * p.stride_w - p.pad_w, 0);
        const int64_t w1 = std::min<int64_t>(ow * p.stride_w - p.pad_w + p.kernel_w, g.w);
        T best = -std::numeric_limits<T>::infinity();
        int64_t best_i = h0 * g.w + w0;
        for (int64_t ih = h0; ih < h1; ++ih)
          for (int64_t iw = w0; iw < w1; ++iw) {
            const T v = x[ih * g.w + iw];
            if (v > best || std::isnan(v)) {  // NaN wins, like PyTorch
              best = v;
              best_i = ih * g.w + iw;
            }
          }
        *y = best;
        *idx = best_i;
      }
    }
  }
}

// Per-window divisor of avg pool, PyTorch's rule: the window clipped to the padded input, or to the
// input itself when padding is not counted.
struct AvgWindow {
  int64_t h0, h1, w0, w1;
  int64_t divisor;
};
inline AvgWindow avg_window(const PoolGeometry& g, int64_t oh, int64_t ow) {
  const Pool2dParams& p = g.p;
  int64_t h0 = oh * p.stride_h - p.pad_h, w0 = ow * p.stride_w - p.pad_w;
  int64_t h1 = std::min<int64_t>(h0 + p.kernel_h, g.h + p.pad_h);
  int64_t w1 = std::min<int64_t>(w0 + p.kernel_w, g.w + p.pad_w);
  const int64_t padded = (h1 - h0) * (w1 - w0);
  h0 = std::max<int64_t>(h0, 0), w0 = std::max<int64_t>(w0, 0);
  h1 = std::min(h1, g.h), w1 = std::min(w1, g.w);
  return {h0, h1, w0, w1, p.count_include_pad ? padded : (h1 - h0) * (w1 - w0)};
}

template <class T>
void avg_pool_forward(const T* x, T* y, const PoolGeometry& g) {
  const int64_t hw = g.h * g.w;
  for (int64_t plane = 0; plane < g.planes; ++plane, x += hw)
    for (int64_t oh = 0; oh < g.oh; ++oh)
      for (int64_t ow = 0; ow < g.ow; ++ow, ++y) {
        const AvgWindow win = avg_window(g, oh, ow);
        T s = 0;
        for (int64_t ih = win.h0; ih < win.h1; ++ih)
          for (int64_t iw = win.w0; iw < win.w1; ++iw) s += x[ih * g.w + iw];
        *y = win.divisor > 0 ? s / static_cast<T>(win.divisor) : T(0);
      }
}

template <class T>
void avg_pool_backward(const T* dy, T* dx, const PoolGeometry& g) {
  const int64_t hw = g.h * g.w;
  std::fill(dx, dx + g.planes * hw, T(0));
  for (int64_t plane = 0; plane < g.planes; ++plane, dx += hw)
    for (int64_t oh = 0; oh < g.oh; ++oh)
      for (int64_t ow = 0; ow < g.ow; ++ow, ++dy) {
        const AvgWindow win = avg_window(g, oh, ow);
        if (win.divisor <= 0) continue;
        const T v = *dy / static_cast<T>(win.divisor);
        for (int64_t ih = win.h0; ih < win.h1; ++ih)
          for (int64_t iw = win.w0; iw < win.w1; ++iw) dx[ih * g.w + iw] += v;
      }
}

void check_4d(const char* op, const Shape& shape) {
  if (shape.size() != 4)
    throw std::invalid_argument(std::string(op) + ": input must be 4-D [N, C, H, W], got " +
                                shape_str(shape));
}

}  // namespace

std::pair<Tensor, Tensor> CpuBackend::max_pool2d(const Tensor& x_in, const Pool2dParams& p) {
  const PoolGeometry g = make_geometry("max_pool2d", x_in.shape(), p);
  const Tensor x = x_in.contiguous();
  const Shape out_shape = output_shape(x.shape(), g);
  Tensor y = Tensor::empty(out_shape, x.dtype());
  Tensor indices = Tensor::empty(out_shape, DType::i64);
  TRAINER_DISPATCH_FLOAT(x.dtype(), "max_pool2d", [&] {
    // Threads take whole planes: every window lies in one.
    const int64_t in_plane = g.h * g.w, out_plane = g.oh * g.ow;
    cpu::parallel_ranges(
        g.planes, x.numel(),
        [&](int64_t p0, int64_t p1) {
          PoolGeometry part = g;
          part.planes = p1 - p0;
          max_pool_forward(x.data<scalar_t>() + p0 * in_plane, y.data<scalar_t>() + p0 * out_plane,
                           indices.data<int64_t>() + p0 * out_plane, part);
        },
        1);
  });
  return {y, indices};
}

Tensor CpuBackend::max_pool2d_backward(const Tensor& grad_y_in, const Tensor& indices_in,
                                       const Shape& x_shape, const Pool2dParams& p) {
  const PoolGeometry g = make_geometry("max_pool2d_backward", x_shape, p);
  if (indices_in.dtype() != DType::i64)
    throw std::invalid_argument("max_pool2d_backward: indices must be i64, got " +
                                std::string(dtype_name(indices_in.dtype())));
  if (grad_y_in.shape() != indices_in.shape() ||
      grad_y_in.shape() != Shape{x_shape[0], x_shape[1], g.oh, g.ow})
    throw std::invalid_argument("max_pool2d_backward: grad_y " + shape_str(grad_y_in.shape()) +
                                " and indices " + shape_str(indices_in.shape()) + " do not match input " +
                                shape_str(x_shape) + " pooled with " + params_str(p));
  const Tensor dy = grad_y_in.contiguous(), indices = indices_in.contiguous();
  Tensor dx = Tensor::empty(x_shape, dy.dtype());
  const int64_t hw = x_shape[2] * x_shape[3];
  const int64_t planes = x_shape[0] * x_shape[1], per_plane = dy.size(2) * dy.size(3);
  // An index outside its plane, reported after the threads are done (nothing may throw inside an
  // OpenMP region): the first thread to find one keeps it.
  std::atomic<bool> failed{false};
  int64_t bad_index = 0;
  TRAINER_DISPATCH_FLOAT(dy.dtype(), "max_pool2d_backward", [&] {
    // Threads take whole planes, as in the forward: each plane's sums stay in one thread, in the same
    // order as on one thread.
    cpu::parallel_ranges(
        planes, planes * (hw + per_plane),
        [&](int64_t p0, int64_t p1) {
          const scalar_t* grad = dy.data<scalar_t>() + p0 * per_plane;
          const int64_t* id = indices.data<int64_t>() + p0 * per_plane;
          scalar_t* d = dx.data<scalar_t>() + p0 * hw;
          std::fill(d, d + (p1 - p0) * hw, scalar_t(0));
          for (int64_t plane = p0; plane < p1; ++plane, d += hw)
            for (int64_t i = 0; i < per_plane; ++i, ++grad, ++id) {
              if (*id < 0 || *id >= hw) {
                if (!failed.exchange(true)) bad_index = *id;
                return;
              }
              d[*id] += *grad;
            }
        },
        1);
  });
  if (failed)
    throw std::invalid_argument("max_pool2d_backward: index " + std::to_string(bad_index) +
                                " outside the input plane of " + std::to_string(hw) + " elements");
  return dx;
}

Tensor CpuBackend::avg_pool2d(const Tensor& x_in, const Pool2dParams& p) {
  const PoolGeometry g = make_geometry("avg_pool2d", x_in.shape(), p);
  const Tensor x = x_in.contiguous();
  Tensor y = Tensor::empty(output_shape(x.shape(), g), x.dtype());
  TRAINER_DISPATCH_FLOAT(x.dtype(), "avg_pool2d",
                         [&] { avg_pool_forward(x.data<scalar_t>(), y.data<scalar_t>(), g); });
  return y;
}

Tensor CpuBackend::avg_pool2d_backward(const Tensor& grad_y_in, const Shape& x_shape, const Pool2dParams& p) {
  const PoolGeometry g = make_geometry("avg_pool2d_backward", x_shape, p);
  check_grad_shape("avg_pool2d_backward", grad_y_in, output_shape(x_shape, g));
  const Tensor dy = grad_y_in.contiguous();
  Tensor dx = Tensor::empty(x_shape, dy.dtype());
  TRAINER_DISPATCH_FLOAT(dy.dtype(), "avg_pool2d_backward",
                         [&] { avg_pool_backward(dy.data<scalar_t>(), dx.data<scalar_t>(), g); });
  return dx;
}

Tensor CpuBackend::global_avg_pool(const Tensor& x_in) {
  check_4d("global_avg_pool", x_in.shape());
  const Tensor x = x_in.contiguous();
  const int64_t planes = x.size(0) * x.size(1), hw = x.size(2) * x.size(3);
  if (hw == 0) throw std::invalid_argument("global_avg_pool: empty planes in input " + shape_str(x.shape()));
  Tensor y = Tensor::empty({x.size(0), x.size(1)}, x.dtype());
  TRAINER_DISPATCH_FLOAT(x.dtype(), "global_avg_pool", [&] {
    const scalar_t* px = x.data<scalar_t>();
    scalar_t* py = y.data<scalar_t>();
    for (int64_t plane = 0; plane < planes; ++plane, px += hw) {
      double s = 0;  // so that f32 means of large planes lose nothing to the summation order
      for (int64_t i = 0; i < hw; ++i) s += px[i];
      py[plane] = static_cast<scalar_t>(s / static_cast<double>(hw));
    }
  });
  return y;
}

Tensor CpuBackend::global_avg_pool_backward(const Tensor& grad_y_in, const Shape& x_shape,
                                            MemoryFormat format) {
  check_4d("global_avg_pool_backward", x_shape);
  if (grad_y_in.shape() != Shape{x_shape[0], x_shape[1]})
    throw std::invalid_argument("global_avg_pool_backward: grad_y has shape " + shape_str(grad_y_in.shape()) +
                                ", expected [N, C] for input " + shape_str(x_shape));
  const Tensor dy = grad_y_in.contiguous();
  const int64_t N = x_shape[0], C = x_shape[1], hw = x_shape[2] * x_shape[3];
  Tensor dx = Tensor::empty(x_shape, dy.dtype(), Device::cpu(), format);
  const bool cl = format == MemoryFormat::channels_last;
  TRAINER_DISPATCH_FLOAT(dy.dtype(), "global_avg_pool_backward", [&] {
    const scalar_t* g = dy.data<scalar_t>();
    scalar_t* d = dx.data<scalar_t>();
    const scalar_t inv = scalar_t(1) / static_cast<scalar_t>(hw);
    if (cl) {  // memory is [N, H*W, C]: every pixel holds its sample's C gradients
      for (int64_t n = 0; n < N; ++n)
        for (int64_t p = 0; p < hw; ++p, d += C)
          for (int64_t c = 0; c < C; ++c) d[c] = g[n * C + c] * inv;
    } else {
      for (int64_t plane = 0; plane < N * C; ++plane, d += hw) std::fill(d, d + hw, g[plane] * inv);
    }
  });
  return dx;
}

}  // namespace trainer
