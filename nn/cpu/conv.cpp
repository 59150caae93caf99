// 2-D convolution on the CPU: im2col + GEMM through OpenBLAS, per group and per chunk of samples.
//
// A chunk is usually one sample. When a layer's output plane is small (late ResNet stages: 4x4 or
// 8x8), a GEMM with OH*OW columns is too thin for OpenBLAS to run near peak, and the weight
// gradient degenerates into many rank-16 updates of a large matrix; so several samples' columns are
// laid side by side in one im2col buffer and the output is scattered back to NCHW afterwards.
// 1x1 stride-1 unpadded convolutions on single-sample chunks skip im2col: x already is the matrix.
// f32 convolutions go to oneDNN first where the build has it (nn/cpu/dnnl_conv.h); this path takes
// f64 and whatever oneDNN declines.
#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "nn/cpu/cpu_backend.h"
#include "nn/cpu/dnnl_conv.h"

namespace trainer {
namespace {

// GEMM column count a chunk aims for, and the most memory its im2col buffer may take.
constexpr int64_t kTargetColumns = 512;
constexpr int64_t kMaxColumnBufferBytes = int64_t{32} << 20;

struct ConvGeometry {
  int64_t n, c, h, w;      // input  [N, C, H, W]
  int64_t o, kh, kw;       // weight [O, C/groups, KH, KW]
  int64_t oh, ow;          // output [N, O, OH, OW]
  int64_t groups, cg, og;  // channels per group in and out
  int64_t k;               // GEMM inner size: cg * kh * kw
  int64_t hw, l;           // input and output plane sizes
  int64_t chunk;           // samples per GEMM
  bool pointwise;          // 1x1, stride 1, no padding: im2col is the identity
  Conv2dParams p;
};

std::string params_str(const Conv2dParams& p) {
  return "stride (" + std::to_string(p.stride_h) + ", " + std::to_string(p.stride_w) + "), padding (" +
         std::to_string(p.pad_h) + ", " + std::to_string(p.pad_w) + "), dilation (" +
         std::to_string(p.dilation_h) + ", " + std::to_string(p.dilation_w) + "), groups " +
         std::to_string(p.groups);
}

// Validates the shapes of a convolution of x_shape by w_shape and derives everything the kernels need.
ConvGeometry make_geometry(const char* op, const Shape& x_shape, const Shape& w_shape, const Conv2dParams& p,
                           size_t elem_size) {
  auto fail = [&](const std::string& why) {
    throw std::invalid_argument(std::string(op) + ": " + why + " (input " + shape_str(x_shape) + ", weight " +
                                shape_str(w_shape) + ", " + params_str(p) + ")");
  };
  if (x_shape.size() != 4) fail("input must be 4-D [N, C, H, W]");
  if (w_shape.size() != 4) fail("weight must be 4-D [O, C/groups, KH, KW]");
  if (p.stride_h < 1 || p.stride_w < 1) fail("stride must be at least 1");
  if (p.dilation_h < 1 || p.dilation_w < 1) fail("dilation must be at least 1");
  if (p.pad_h < 0 || p.pad_w < 0) fail("padding must be non-negative");
  if (p.groups < 1) fail("groups must be at least 1");
  ConvGeometry g;
  g.p = p;
  g.n = x_shape[0], g.c = x_shape[1], g.h = x_shape[2], g.w = x_shape[3];
  g.o = w_shape[0], g.kh = w_shape[2], g.kw = w_shape[3];
  g.groups = p.groups;
  if (g.c < 1 || g.o < 1 || g.kh < 1 || g.kw < 1) fail("channels and kernel sizes must be positive");
  if (g.c % g.groups != 0) fail("input channels are not divisible by groups");
  if (g.o % g.groups != 0) fail("output channels are not divisible by groups");
  g.cg = g.c / g.groups;
  g.og = g.o / g.groups;
  if (w_shape[1] != g.cg)
    fail("weight expects " + std::to_string(w_shape[1] * g.groups) + " input channels, input has " +
         std::to_string(g.c));
  // Checked here because conv_output_size's integer division truncates a negative span towards zero.
  if (g.h + 2 * p.pad_h < p.dilation_h * (g.kh - 1) + 1 || g.w + 2 * p.pad_w < p.dilation_w * (g.kw - 1) + 1)
    fail("the (dilated) kernel is larger than the padded input");
  g.oh = conv_output_size(g.h, static_cast<int>(g.kh), p.stride_h, p.pad_h, p.dilation_h);
  g.ow = conv_output_size(g.w, static_cast<int>(g.kw), p.stride_w, p.pad_w, p.dilation_w);
  g.k = g.cg * g.kh * g.kw;
  g.hw = g.h * g.w;
  g.l = g.oh * g.ow;
  g.pointwise = g.kh == 1 && g.kw == 1 && p.stride_h == 1 && p.stride_w == 1 && p.pad_h == 0 && p.pad_w == 0;
  const int64_t by_columns = (kTargetColumns + g.l - 1) / g.l;
  const int64_t by_memory =
      kMaxColumnBufferBytes / std::max<int64_t>(1, g.k * g.l * static_cast<int64_t>(elem_size));
  g.chunk = std::clamp<int64_t>(std::min(by_columns, by_memory), 1, std::max<int64_t>(1, g.n));
  return g;
}

Shape output_shape(const ConvGeometry& g) { return {g.n, g.o, g.oh, g.ow}; }

void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
}
void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, const double* a,
          int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, 1.0, a, lda, b, ldb, beta, c, ldc);
}

// Output columns [lo, hi) whose input column ow * stride + offset lies inside [0, size).
inline void valid_range(int64_t out, int64_t size, int64_t stride, int64_t offset, int64_t& lo, int64_t& hi) {
  lo = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  hi = offset >= size ? 0 : (size - 1 - offset) / stride + 1;
  lo = std::min(lo, out);
  hi = std::clamp(hi, lo, out);
}

// x: one group of one sample [cg, H, W]; col: [cg * KH * KW, OH * OW] with row stride ld.
template <class T>
void im2col(const T* x, const ConvGeometry& g, T* col, int64_t ld) {
  const Conv2dParams& p = g.p;
  for (int64_t c = 0; c < g.cg; ++c) {
    const T* xc = x + c * g.hw;
    for (int64_t ki = 0; ki < g.kh; ++ki) {
      const int64_t row_offset = ki * p.dilation_h - p.pad_h;
      int64_t oh_lo, oh_hi;
      valid_range(g.oh, g.h, p.stride_h, row_offset, oh_lo, oh_hi);
      for (int64_t kj = 0; kj < g.kw; ++kj, col += ld) {
        const int64_t col_offset = kj * p.dilation_w - p.pad_w;
        int64_t ow_lo, ow_hi;
        valid_range(g.ow, g.w, p.stride_w, col_offset, ow_lo, ow_hi);
        std::fill(col, col + oh_lo * g.ow, T(0));
        for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
          T* out = col + oh * g.ow;
          const T* in = xc + (oh * p.stride_h + row_offset) * g.w + col_offset;
          std::fill(out, out + ow_lo, T(0));
          if (p.stride_w == 1) {
            std::memcpy(out + ow_lo, in + ow_lo, static_cast<size_t>(ow_hi - ow_lo) * sizeof(T));
          } else {
            for (int64_t ow = ow_lo; ow < ow_hi; ++ow) out[ow] = in[ow * p.stride_w];
          }
          std::fill(out + ow_hi, out + g.ow, T(0));
        }
        std::fill(col + oh_hi * g.ow, col + g.l, T(0));
      }
    }
  }
}

// The adjoint of im2col: accumulates col [cg * KH * KW, OH * OW] (row stride ld) into dx [cg, H, W].
template <class T>
void col2im(const T* col, int64_t ld, const ConvGeometry& g, T* dx) {
  const Conv2dParams& p = g.p;
  for (int64_t c = 0; c < g.cg; ++c) {
    T* dxc = dx + c * g.hw;
    for (int64_t ki = 0; ki < g.kh; ++ki) {
      const int64_t row_offset = ki * p.dilation_h - p.pad_h;
      int64_t oh_lo, oh_hi;
      valid_range(g.oh, g.h, p.stride_h, row_offset, oh_lo, oh_hi);
      for (int64_t kj = 0; kj < g.kw; ++kj, col += ld) {
        const int64_t col_offset = kj * p.dilation_w - p.pad_w;
        int64_t ow_lo, ow_hi;
        valid_range(g.ow, g.w, p.stride_w, col_offset, ow_lo, ow_hi);
        for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
          const T* in = col + oh * g.ow;
          T* out = dxc + (oh * p.stride_h + row_offset) * g.w + col_offset;
          if (p.stride_w == 1) {
            for (int64_t ow = ow_lo; ow < ow_hi; ++ow) out[ow] += in[ow];
          } else {
            for (int64_t ow = ow_lo; ow < ow_hi; ++ow) out[ow * p.stride_w] += in[ow];
          }
        }
      }
    }
  }
}

// Copies rows [og, L] of `b` samples' NCHW planes (sample stride s) into a [og, b * L] matrix, or back.
template <class T>
void gather_samples(const T* src, int64_t sample_stride, int64_t rows, int64_t l, int64_t b, T* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t s = 0; s < b; ++s)
      std::memcpy(dst + (r * b + s) * l, src + s * sample_stride + r * l, static_cast<size_t>(l) * sizeof(T));
}
template <class T>
void scatter_samples(const T* src, int64_t rows, int64_t l, int64_t b, T* dst, int64_t sample_stride) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t s = 0; s < b; ++s)
      std::memcpy(dst + s * sample_stride + r * l, src + (r * b + s) * l, static_cast<size_t>(l) * sizeof(T));
}

template <class T>
std::unique_ptr<T[]> buffer(int64_t n) {
  return std::unique_ptr<T[]>(new T[static_cast<size_t>(n)]);
}

// Builds the [k, b * L] column matrix of group `gi` for samples [n0, n0 + b), or points into x
// directly when that already is the matrix. Returns the matrix and its row stride.
template <class T>
const T* columns(const T* x, const ConvGeometry& g, int64_t n0, int64_t b, int64_t gi, T* col, int64_t& ld) {
  const T* xg = x + (n0 * g.c + gi * g.cg) * g.hw;
  if (g.pointwise && b == 1) {
    ld = g.hw;
    return xg;
  }
  ld = b * g.l;
  for (int64_t s = 0; s < b; ++s) im2col(xg + s * g.c * g.hw, g, col + s * g.l, ld);
  return col;
}

template <class T>
void conv_forward(const T* x, const T* w, const T* bias, T* y, const ConvGeometry& g) {
  const bool need_col = !(g.pointwise && g.chunk == 1);
  auto col = need_col ? buffer<T>(g.k * g.chunk * g.l) : nullptr;
  auto tmp = g.chunk > 1 ? buffer<T>(g.og * g.chunk * g.l) : nullptr;
  for (int64_t n0 = 0; n0 < g.n; n0 += g.chunk) {
    const int64_t b = std::min(g.chunk, g.n - n0);
    for (int64_t gi = 0; gi < g.groups; ++gi) {
      int64_t ld;
      const T* cols = columns(x, g, n0, b, gi, col.get(), ld);
      const T* wg = w + gi * g.og * g.k;
      T* yg = y + (n0 * g.o + gi * g.og) * g.l;
      if (b == 1) {
        gemm(CblasNoTrans, CblasNoTrans, g.og, g.l, g.k, wg, g.k, cols, ld, T(0), yg, g.l);
      } else {
        gemm(CblasNoTrans, CblasNoTrans, g.og, b * g.l, g.k, wg, g.k, cols, ld, T(0), tmp.get(), b * g.l);
        scatter_samples(tmp.get(), g.og, g.l, b, yg, g.o * g.l);
      }
    }
  }
  if (bias)
    for (int64_t n = 0; n < g.n; ++n)
      for (int64_t o = 0; o < g.o; ++o) {
        T* plane = y + (n * g.o + o) * g.l;
        const T v = bias[o];
        for (int64_t i = 0; i < g.l; ++i) plane[i] += v;
      }
}

template <class T>
void conv_backward_input(const T* dy, const T* w, T* dx, const ConvGeometry& g) {
  const bool direct = g.pointwise && g.chunk == 1;
  auto col = direct ? nullptr : buffer<T>(g.k * g.chunk * g.l);
  auto tmp = g.chunk > 1 ? buffer<T>(g.og * g.chunk * g.l) : nullptr;
  if (!direct) std::fill(dx, dx + g.n * g.c * g.hw, T(0));
  for (int64_t n0 = 0; n0 < g.n; n0 += g.chunk) {
    const int64_t b = std::min(g.chunk, g.n - n0);
    for (int64_t gi = 0; gi < g.groups; ++gi) {
      const T* wg = w + gi * g.og * g.k;
      const T* dyg = dy + (n0 * g.o + gi * g.og) * g.l;
      T* dxg = dx + (n0 * g.c + gi * g.cg) * g.hw;
      if (b > 1) {
        gather_samples(dyg, g.o * g.l, g.og, g.l, b, tmp.get());
        dyg = tmp.get();
      }
      if (direct) {  // dx_g [cg, HW] = w_g^T [cg, og] @ dy_g [og, HW]
        gemm(CblasTrans, CblasNoTrans, g.k, g.l, g.og, wg, g.k, dyg, g.l, T(0), dxg, g.hw);
        continue;
      }
      const int64_t ld = b * g.l;
      gemm(CblasTrans, CblasNoTrans, g.k, ld, g.og, wg, g.k, dyg, ld, T(0), col.get(), ld);
      for (int64_t s = 0; s < b; ++s) col2im(col.get() + s * g.l, ld, g, dxg + s * g.c * g.hw);
    }
  }
}

template <class T>
void conv_backward_weight(const T* dy, const T* x, T* dw, const ConvGeometry& g) {
  const bool need_col = !(g.pointwise && g.chunk == 1);
  auto col = need_col ? buffer<T>(g.k * g.chunk * g.l) : nullptr;
  auto tmp = g.chunk > 1 ? buffer<T>(g.og * g.chunk * g.l) : nullptr;
  std::fill(dw, dw + g.o * g.k, T(0));
  for (int64_t n0 = 0; n0 < g.n; n0 += g.chunk) {
    const int64_t b = std::min(g.chunk, g.n - n0);
    for (int64_t gi = 0; gi < g.groups; ++gi) {
      int64_t ld;
      const T* cols = columns(x, g, n0, b, gi, col.get(), ld);
      const T* dyg = dy + (n0 * g.o + gi * g.og) * g.l;
      if (b > 1) {
        gather_samples(dyg, g.o * g.l, g.og, g.l, b, tmp.get());
        dyg = tmp.get();
      }
      // dw_g [og, k] += dy_g [og, b*L] @ cols^T [b*L, k]
      gemm(CblasNoTrans, CblasTrans, g.og, g.k, b * g.l, dyg, b * g.l, cols, ld, T(1), dw + gi * g.og * g.k,
           g.k);
    }
  }
}

void check_float_dtypes(const char* op, const Tensor& a, const char* a_name, const Tensor& b,
                        const char* b_name) {
  if (a.dtype() != b.dtype())
    throw std::invalid_argument(std::string(op) + ": " + a_name + " is " +
                                std::string(dtype_name(a.dtype())) + " but " + b_name + " is " +
                                std::string(dtype_name(b.dtype())));
}

void check_grad_shape(const char* op, const Tensor& grad_y, const ConvGeometry& g) {
  if (grad_y.shape() != output_shape(g))
    throw std::invalid_argument(std::string(op) + ": grad_y has shape " + shape_str(grad_y.shape()) +
                                ", the convolution's output shape is " + shape_str(output_shape(g)));
}

}  // namespace

Tensor CpuBackend::conv2d(const Tensor& x_in, const Tensor& w_in, const Tensor& bias_in,
                          const Conv2dParams& p) {
  check_float_dtypes("conv2d", x_in, "input", w_in, "weight");
  const ConvGeometry g = make_geometry("conv2d", x_in.shape(), w_in.shape(), p, dtype_size(x_in.dtype()));
  Tensor bias;
  if (bias_in.defined()) {
    check_float_dtypes("conv2d", x_in, "input", bias_in, "bias");
    if (bias_in.shape() != Shape{g.o})
      throw std::invalid_argument("conv2d: bias has shape " + shape_str(bias_in.shape()) + ", expected [" +
                                  std::to_string(g.o) + "] for weight " + shape_str(w_in.shape()));
    bias = bias_in.contiguous();
  }
  if (Tensor y = dnnl_conv2d(x_in, w_in, bias, p); y.defined()) return y;
  const Tensor x = x_in.contiguous(), w = w_in.contiguous();
  Tensor y = Tensor::empty(output_shape(g), x.dtype());
  TRAINER_DISPATCH_FLOAT(x.dtype(), "conv2d", [&] {
    conv_forward(x.data<scalar_t>(), w.data<scalar_t>(), bias.defined() ? bias.data<scalar_t>() : nullptr,
                 y.data<scalar_t>(), g);
  });
  return y;
}

Tensor CpuBackend::conv2d_backward_input(const Tensor& grad_y_in, const Tensor& w_in, const Shape& x_shape,
                                         const Conv2dParams& p) {
  check_float_dtypes("conv2d_backward_input", grad_y_in, "grad_y", w_in, "weight");
  const ConvGeometry g =
      make_geometry("conv2d_backward_input", x_shape, w_in.shape(), p, dtype_size(grad_y_in.dtype()));
  check_grad_shape("conv2d_backward_input", grad_y_in, g);
  if (Tensor dx = dnnl_conv2d_backward_input(grad_y_in, w_in, x_shape, p); dx.defined()) return dx;
  const Tensor dy = grad_y_in.contiguous(), w = w_in.contiguous();
  Tensor dx = Tensor::empty(x_shape, dy.dtype());
  TRAINER_DISPATCH_FLOAT(dy.dtype(), "conv2d_backward_input", [&] {
    conv_backward_input(dy.data<scalar_t>(), w.data<scalar_t>(), dx.data<scalar_t>(), g);
  });
  return dx;
}

Tensor CpuBackend::conv2d_backward_weight(const Tensor& grad_y_in, const Tensor& x_in, const Shape& w_shape,
                                          const Conv2dParams& p) {
  check_float_dtypes("conv2d_backward_weight", grad_y_in, "grad_y", x_in, "input");
  const ConvGeometry g =
      make_geometry("conv2d_backward_weight", x_in.shape(), w_shape, p, dtype_size(grad_y_in.dtype()));
  check_grad_shape("conv2d_backward_weight", grad_y_in, g);
  if (Tensor dw = dnnl_conv2d_backward_weight(grad_y_in, x_in, w_shape, p); dw.defined()) return dw;
  const Tensor dy = grad_y_in.contiguous(), x = x_in.contiguous();
  Tensor dw = Tensor::empty(w_shape, dy.dtype());
  TRAINER_DISPATCH_FLOAT(dy.dtype(), "conv2d_backward_weight", [&] {
    conv_backward_weight(dy.data<scalar_t>(), x.data<scalar_t>(), dw.data<scalar_t>(), g);
  });
  return dw;
}

}  // namespace trainer
