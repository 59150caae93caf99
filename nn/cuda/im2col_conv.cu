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
#include "nn/cuda/im2col_patches.h"
#include "nn/cuda/kernels.cuh"

namespace trainer::cuda {
namespace {

constexpr int64_t kMaxChannels = 4;
constexpr int64_t kMaxPatchBytes = int64_t{4} << 30;
std::atomic<int64_t> g_calls{0};

Patches patches_for(const Shape& x, const Shape& w_shape, const Conv2dParams& p, const Shape& y) {
  const auto i = [](int64_t v) { return static_cast<int>(v); };
  const int k = i(w_shape[1] * w_shape[2] * w_shape[3]);
  Patches g{.n = i(x[0]),
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
            .kp = (k + kPatchPack - 1) / kPatchPack * kPatchPack,
            .starts = {}};
  fill_pack_starts(g);
  return g;
}

// A thread per 16-byte pack (im2col_patches.h has the arithmetic and the launch's shape): a block
// writes whole rows back to back, and no thread divides to find its pixel or its place in the window.
// The first version found both by division (nine 32-bit divisions a pack) and ran at ~1.1 TB/s: 0.87
// ms for ResNet-50's 976 MB of patches at batch 256 on an H200. A thread per row with the 7x7x3
// window unrolled was slower still (its 304-byte rows make each warp's stores hit 32 lines).
__global__ void im2col_nhwc_kernel(Patches g, int rows_per_block, const uint16_t* x, uint16_t* cols) {
  struct alignas(16) Pack {
    uint16_t v[kPatchPack];
  };
  const int64_t out_rows = int64_t{g.n} * g.oh;
  for (int64_t out_row = blockIdx.y; out_row < out_rows; out_row += gridDim.y) {
    PackAt at;
    if (!pack_at(g, rows_per_block, blockIdx.x, out_row, threadIdx.x, threadIdx.y, at)) return;
    Pack out;
    fill_pack(g, x + static_cast<int64_t>(at.n) * g.h * g.w * g.c, at.oh, at.ow, at.j, out.v);
    *reinterpret_cast<Pack*>(cols + at.m * g.kp + at.j * kPatchPack) = out;
  }
}

// The patch geometry of this convolution where the im2col path applies; nullopt where cuDNN runs it.
std::optional<Patches> patches_if_applies(const Tensor& x, const Shape& w_shape, const Conv2dParams& p,
                                          const Shape& y_shape) {
  if (x.dim() != 4 || (x.dtype() != DType::bf16 && x.dtype() != DType::f16) || x.size(1) > kMaxChannels ||
      p.groups != 1 || cuda_deterministic() || x.suggest_memory_format() != MemoryFormat::channels_last ||
      !x.is_contiguous(MemoryFormat::channels_last))
    return std::nullopt;  // (a one-channel NCHW x is channels-last contiguous too, but cuDNN keeps it NCHW)
  const Patches g = patches_for(x.shape(), w_shape, p, y_shape);
  if (g.rows() == 0 || w_shape[0] == 0 || g.packs() > kMaxTabledPacks || int64_t{g.n} * g.oh >= (1 << 30) ||
      g.rows() * g.kp * 2 > kMaxPatchBytes)
    return std::nullopt;
  return g;
}

// The [rows, kp] patch matrix of a dense channels-last x.
Tensor im2col(const Tensor& x, const Patches& g) {
  Tensor cols = empty({g.rows(), g.kp}, x.dtype());
  const PatchLaunch l = patch_launch(g);
  im2col_nhwc_kernel<<<dim3(l.grid_x, l.grid_y), dim3(g.packs(), l.rows_per_block), 0, cuda_stream()>>>(
      g, l.rows_per_block, static_cast<const uint16_t*>(x.raw_data()),
      static_cast<uint16_t*>(cols.raw_data()));
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

Tensor forward(const Tensor& x, const Tensor& w, const Patches& g, const Shape& y_shape) {
  Tensor wm = empty({w.size(0), g.kp}, w.dtype());  // zero columns past k, as the patches have
  if (g.kp != g.k) wm.zero_();
  wm.slice(1, 0, g.k).copy_(weight_rows(w));
  const F32Reductions f32_sums;
  const Tensor y = backend_for(x).matmul(im2col(x, g), wm, false, true);  // [N*OH*OW, Cout]: NHWC
  return y.view({y_shape[0], y_shape[2], y_shape[3], y_shape[1]}).permute({0, 3, 1, 2});
}

Tensor backward_weight(const Tensor& grad_y, const Tensor& x, const Shape& w_shape, const Patches& g,
                       MemoryFormat format) {
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
bool chosen(int direction, const Tensor& x, const Shape& w_shape, const Conv2dParams& p,
            const std::function<Tensor()>& im2col_run, const std::function<Tensor()>& cudnn) {
  if (cuda_options().force_im2col_conv) return true;
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
  const std::optional<Patches> g = patches_if_applies(x, w.shape(), p, y_shape);
  if (!g || w.dtype() != x.dtype()) return std::nullopt;
  const auto run = [&] { return forward(x, w, *g, y_shape); };
  if (!chosen(0, x, w.shape(), p, run, cudnn)) return std::nullopt;
  return run_or_decline(run);
}

std::optional<Tensor> im2col_conv_backward_weight(const Tensor& grad_y, const Tensor& x, const Shape& w_shape,
                                                  const Conv2dParams& p, MemoryFormat format,
                                                  const std::function<Tensor()>& cudnn) {
  const std::optional<Patches> g = patches_if_applies(x, w_shape, p, grad_y.shape());
  if (!g || grad_y.dtype() != x.dtype()) return std::nullopt;
  const auto run = [&] { return backward_weight(grad_y, x, w_shape, *g, format); };
  if (!chosen(1, x, w_shape, p, run, cudnn)) return std::nullopt;
  return run_or_decline(run);
}

int64_t im2col_conv_calls() { return g_calls; }

}  // namespace trainer::cuda
