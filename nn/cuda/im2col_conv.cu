// im2col + GEMM for convolutions with few input channels: see im2col_conv.h for when and why.
#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>
#include <stdexcept>
#include <tuple>

#include "nn/cuda/conv_timing.h"
#include "nn/cuda/cuda_backend.h"
#include "nn/cuda/im2col_conv.h"
#include "nn/cuda/kernels.cuh"

namespace trainer::cuda {
namespace {

constexpr int64_t kMaxChannels = 4;
constexpr int64_t kMaxPatchBytes = int64_t{4} << 30;
constexpr int kPack = 8;  // 16-bit values per 16-byte store

std::atomic<bool> g_forced{false};
std::atomic<int64_t> g_calls{0};

// One convolution's patch matrix: rows = N*OH*OW output pixels, columns = (r, s, c) in the weight's
// channels-last order, zero-padded from k to kp (a multiple of 8, so every row is whole 16-byte packs).
struct Patches {
  int n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, k, kp;
  int64_t rows() const { return int64_t{n} * oh * ow; }
};

Patches patches_for(const Shape& x, const Shape& w_shape, const Conv2dParams& p, const Shape& y) {
  const auto i = [](int64_t v) { return static_cast<int>(v); };
  const int k = i(w_shape[1] * w_shape[2] * w_shape[3]);
  return {.n = i(x[0]),
          .c = i(x[1]),
          .h = i(x[2]),
          .w = i(x[3]),
          .oh = i(y[2]),
          .ow = i(y[3]),
          .kh = i(w_shape[2]),
          .kw = i(w_shape[3]),
          .sh = p.stride_h,
          .sw = p.stride_w,
          .ph = p.pad_h,
          .pw = p.pad_w,
          .dh = p.dilation_h,
          .dw = p.dilation_w,
          .k = k,
          .kp = (k + kPack - 1) / kPack * kPack};
}

// A thread per 16-byte pack of a row: consecutive threads write consecutive packs. The (r, s, c) of
// the pack's first column is found by division once, then stepped. It runs at ~1.1 TB/s (0.87 ms for
// ResNet-50's 976 MB of patches at batch 256 on an H200), bound by its index arithmetic. A thread per
// row with the 7x7x3 window unrolled was slower still (its 304-byte rows make each warp's stores hit
// 32 lines): timing then gave the stem back to cuDNN (session 13).
__global__ void im2col_nhwc_kernel(Patches g, const uint16_t* x, uint16_t* cols, uint32_t total) {
  const uint32_t packs = static_cast<uint32_t>(g.kp / kPack);
  for (uint32_t t = blockIdx.x * blockDim.x + threadIdx.x; t < total; t += gridDim.x * blockDim.x) {
    const uint32_t m = t / packs, j = t - m * packs;
    const uint32_t ow = m % g.ow, q = m / g.ow, oh = q % g.oh, n = q / g.oh;
    const int k0 = static_cast<int>(j) * kPack;
    int c = k0 % g.c, s = (k0 / g.c) % g.kw, r = k0 / (g.c * g.kw);
    const int ih0 = static_cast<int>(oh) * g.sh - g.ph, iw0 = static_cast<int>(ow) * g.sw - g.pw;
    const uint16_t* image = x + static_cast<int64_t>(n) * g.h * g.w * g.c;
    struct alignas(16) Pack {
      uint16_t v[kPack];
    } out;
#pragma unroll
    for (int e = 0; e < kPack; ++e) {
      uint16_t v = 0;  // +0 in bf16 and f16
      const int ih = ih0 + r * g.dh, iw = iw0 + s * g.dw;
      if (k0 + e < g.k && ih >= 0 && ih < g.h && iw >= 0 && iw < g.w)
        v = image[(static_cast<int64_t>(ih) * g.w + iw) * g.c + c];
      out.v[e] = v;
      if (++c == g.c) {
        c = 0;
        if (++s == g.kw) s = 0, ++r;
      }
    }
    *reinterpret_cast<Pack*>(cols + static_cast<int64_t>(m) * g.kp + k0) = out;
  }
}

bool applies(const Tensor& x, const Shape& w_shape, const Conv2dParams& p, const Shape& y_shape) {
  if (x.dim() != 4 || (x.dtype() != DType::bf16 && x.dtype() != DType::f16) || x.size(1) > kMaxChannels ||
      p.groups != 1 || cuda_deterministic() || x.suggest_memory_format() != MemoryFormat::channels_last ||
      !x.is_contiguous(MemoryFormat::channels_last))
    return false;  // (a one-channel NCHW x is channels-last contiguous too, but cuDNN keeps it NCHW)
  const Patches g = patches_for(x.shape(), w_shape, p, y_shape);
  return g.rows() > 0 && w_shape[0] > 0 && g.rows() * g.kp * 2 <= kMaxPatchBytes;
}

// The [rows, kp] patch matrix of a dense channels-last x.
Tensor im2col(const Tensor& x, const Patches& g) {
  Tensor cols = empty({g.rows(), g.kp}, x.dtype());
  const uint32_t total = static_cast<uint32_t>(g.rows() * (g.kp / kPack));
  constexpr int kThreads = 256;
  im2col_nhwc_kernel<<<grid_size(total, kThreads), kThreads, 0, cuda_stream()>>>(
      g, static_cast<const uint16_t*>(x.raw_data()), static_cast<uint16_t*>(cols.raw_data()), total);
  CUDA_CHECK_LAUNCH();
  return cols;
}

// The GEMMs stand in for cuDNN convolutions, which run no engine that sums in the output type (those
// with reduced-precision notes are skipped, conv_graph_api.cpp). cuBLAS's default math mode lets a
// split-K GEMM add its partial sums in bf16/f16: the weight gradient's K is N*OH*OW (3.2M at ResNet-50
// batch 256), the shape that splits. So reductions stay in f32 around these calls.
class F32Reductions {
 public:
  F32Reductions() : handle_(cuda_context().cublas) {
    CUBLAS_CHECK(cublasGetMathMode(handle_, &saved_));
    CUBLAS_CHECK(cublasSetMathMode(
        handle_, static_cast<cublasMath_t>(saved_ | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  }
  ~F32Reductions() { cublasSetMathMode(handle_, saved_); }
  F32Reductions(const F32Reductions&) = delete;
  F32Reductions& operator=(const F32Reductions&) = delete;

 private:
  cublasHandle_t handle_;
  cublasMath_t saved_ = CUBLAS_DEFAULT_MATH;
};

// A [Cout, C, kh, kw] weight as [Cout, k] rows in (r, s, c) order, and back.
Tensor weight_rows(const Tensor& w) {
  return w.contiguous(MemoryFormat::channels_last).permute({0, 2, 3, 1}).reshape({w.size(0), -1});
}
Tensor weight_of_rows(const Tensor& rows, const Shape& w_shape, MemoryFormat format) {
  return rows.contiguous()
      .view({w_shape[0], w_shape[2], w_shape[3], w_shape[1]})
      .permute({0, 3, 1, 2})
      .contiguous(format);
}

Tensor forward(const Tensor& x, const Tensor& w, const Conv2dParams& p, const Shape& y_shape) {
  const Patches g = patches_for(x.shape(), w.shape(), p, y_shape);
  Tensor wm = empty({w.size(0), g.kp}, w.dtype());  // zero columns past k, as the patches have
  if (g.kp != g.k) wm.zero_();
  wm.slice(1, 0, g.k).copy_(weight_rows(w));
  const F32Reductions f32_sums;
  const Tensor y = backend_for(x).matmul(im2col(x, g), wm, false, true);  // [N*OH*OW, Cout]: NHWC
  return y.view({y_shape[0], y_shape[2], y_shape[3], y_shape[1]}).permute({0, 3, 1, 2});
}

Tensor backward_weight(const Tensor& grad_y, const Tensor& x, const Shape& w_shape, const Conv2dParams& p,
                       MemoryFormat format) {
  const Patches g = patches_for(x.shape(), w_shape, p, grad_y.shape());
  const Tensor dy =
      grad_y.contiguous(MemoryFormat::channels_last).permute({0, 2, 3, 1}).reshape({g.rows(), w_shape[0]});
  const F32Reductions f32_sums;
  const Tensor dwm = backend_for(x).matmul(dy, im2col(x, g), true, false);  // [Cout, kp]
  return weight_of_rows(dwm.slice(1, 0, g.k), w_shape, format);
}

enum class Choice { untimed, im2col, cudnn };
// direction (0 forward, 1 weight gradient), x's shape, the weight's shape, stride, padding, dilation, dtype
using Key = std::tuple<int, Shape, Shape, int, int, int, int, int, int, DType>;

// Whether this shape and direction runs im2col: forced, or timed once against cuDNN at an eager call.
template <class Run>
bool chosen(int direction, const Tensor& x, const Shape& w_shape, const Conv2dParams& p, Run&& im2col_run,
            const std::function<Tensor()>& cudnn) {
  if (g_forced) return true;
  static std::mutex mutex;
  static auto* choices = new std::map<Key, Choice>();  // leaked: kept to exit
  const Key key{direction, x.shape(), w_shape,      p.stride_h,   p.stride_w,
                p.pad_h,   p.pad_w,   p.dilation_h, p.dilation_w, x.dtype()};
  {
    std::lock_guard<std::mutex> lock(mutex);
    const Choice c = (*choices)[key];
    if (c != Choice::untimed) return c == Choice::im2col;
  }
  if (cuda_stream_capturing()) return false;  // timed at an eager call, if one comes
  // A run that throws (no memory for the patches, say) times as infinitely slow: cuDNN keeps the shape.
  const float ours = cudnn_conv::time_calls([&] {
    try {
      return im2col_run().defined();
    } catch (const std::exception&) {
      return false;
    }
  });
  const float theirs = cudnn_conv::time_calls([&] { return cudnn().defined(); });
  std::lock_guard<std::mutex> lock(mutex);
  (*choices)[key] = ours < theirs ? Choice::im2col : Choice::cudnn;
  return ours < theirs;
}

// Runs the chosen im2col path; if it throws outside a capture (nothing has read its output yet), says
// so once and lets cuDNN run this call.
template <class Run>
std::optional<Tensor> run_or_decline(Run&& run) {
  try {
    Tensor out = run();
    ++g_calls;
    return out;
  } catch (const std::exception& e) {
    if (cuda_stream_capturing()) throw;
    static std::atomic<bool> said{false};
    if (!said.exchange(true))
      std::fprintf(stderr, "trainer: im2col convolution failed (%s); cuDNN runs it\n", e.what());
    return std::nullopt;
  }
}

}  // namespace

std::optional<Tensor> im2col_conv_forward(const Tensor& x, const Tensor& w, const Conv2dParams& p,
                                          const Shape& y_shape, const std::function<Tensor()>& cudnn) {
  if (!applies(x, w.shape(), p, y_shape) || w.dtype() != x.dtype()) return std::nullopt;
  const auto run = [&] { return forward(x, w, p, y_shape); };
  if (!chosen(0, x, w.shape(), p, run, cudnn)) return std::nullopt;
  return run_or_decline(run);
}

std::optional<Tensor> im2col_conv_backward_weight(const Tensor& grad_y, const Tensor& x, const Shape& w_shape,
                                                  const Conv2dParams& p, MemoryFormat format,
                                                  const std::function<Tensor()>& cudnn) {
  if (!applies(x, w_shape, p, grad_y.shape()) || grad_y.dtype() != x.dtype()) return std::nullopt;
  const auto run = [&] { return backward_weight(grad_y, x, w_shape, p, format); };
  if (!chosen(1, x, w_shape, p, run, cudnn)) return std::nullopt;
  return run_or_decline(run);
}

void force_im2col_conv(bool on) { g_forced = on; }
int64_t im2col_conv_calls() { return g_calls; }

}  // namespace trainer::cuda
