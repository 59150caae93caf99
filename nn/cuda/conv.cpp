// 2-D convolution and both backwards through cuDNN. Host code only (cuDNN calls), so a .cpp file.
//
// Layout: NCHW or NHWC (channels_last), following the input (forward, weight gradient) or grad_y
// (input gradient); the weight is laid out to match and results come back in that memory format.
// f64 runs in NCHW (cuDNN has no NHWC double kernels), as does any shape whose NHWC form cuDNN
// cannot run. The algorithm is chosen once per (op, shapes, params, dtype, layout, TF32 setting) by
// benchmarking with cudnnFind*AlgorithmEx and cached; workspaces come from the caching allocator.
// f32 runs with CUDNN_FMA_MATH (no TF32) unless cuda_set_allow_tf32(true).
#include <array>
#include <map>
#include <mutex>

#include "nn/cuda/cuda_common.h"

namespace trainer {
namespace {

constexpr size_t kFindWorkspaceBytes = size_t{256} << 20;
constexpr int kMaxAlgos = 16;

enum class ConvOp : int { forward, backward_data, backward_filter };

struct NoAlgorithm {};  // thrown when cuDNN has no algorithm for a layout; the caller retries in NCHW

struct Choice {
  int algo = -1;  // -1: none runs in this layout
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

using Key = std::array<int64_t, 20>;
std::mutex g_cache_mutex;
std::map<Key, Choice> g_cache;

std::string params_str(const Conv2dParams& p) {
  return "stride (" + std::to_string(p.stride_h) + ", " + std::to_string(p.stride_w) + "), padding (" +
         std::to_string(p.pad_h) + ", " + std::to_string(p.pad_w) + "), dilation (" +
         std::to_string(p.dilation_h) + ", " + std::to_string(p.dilation_w) + "), groups " +
         std::to_string(p.groups);
}

// Validates a convolution of x_shape by w_shape (the CPU backend's rules) and returns the output shape.
Shape check_geometry(const char* op, const Shape& x, const Shape& w, const Conv2dParams& p) {
  auto fail = [&](const std::string& why) {
    throw std::invalid_argument(std::string(op) + ": " + why + " (input " + shape_str(x) + ", weight " +
                                shape_str(w) + ", " + params_str(p) + ")");
  };
  if (x.size() != 4) fail("input must be 4-D [N, C, H, W]");
  if (w.size() != 4) fail("weight must be 4-D [O, C/groups, KH, KW]");
  if (p.stride_h < 1 || p.stride_w < 1) fail("stride must be at least 1");
  if (p.dilation_h < 1 || p.dilation_w < 1) fail("dilation must be at least 1");
  if (p.pad_h < 0 || p.pad_w < 0) fail("padding must be non-negative");
  if (p.groups < 1) fail("groups must be at least 1");
  if (x[1] < 1 || w[0] < 1 || w[2] < 1 || w[3] < 1) fail("channels and kernel sizes must be positive");
  if (x[1] % p.groups != 0) fail("input channels are not divisible by groups");
  if (w[0] % p.groups != 0) fail("output channels are not divisible by groups");
  if (w[1] * p.groups != x[1])
    fail("weight expects " + std::to_string(w[1] * p.groups) + " input channels, input has " +
         std::to_string(x[1]));
  if (x[2] + 2 * p.pad_h < p.dilation_h * (w[2] - 1) + 1 ||
      x[3] + 2 * p.pad_w < p.dilation_w * (w[3] - 1) + 1)
    fail("the (dilated) kernel is larger than the padded input");
  for (int64_t d : x)
    if (d > INT32_MAX) fail("dimension exceeds cuDNN's int range");
  return {x[0], w[0], conv_output_size(x[2], static_cast<int>(w[2]), p.stride_h, p.pad_h, p.dilation_h),
          conv_output_size(x[3], static_cast<int>(w[3]), p.stride_w, p.pad_w, p.dilation_w)};
}

cudnnDataType_t cudnn_type(DType dtype, const char* op) {
  switch (dtype) {
    case DType::f32:
      return CUDNN_DATA_FLOAT;
    case DType::f64:
      return CUDNN_DATA_DOUBLE;
    case DType::f16:
      return CUDNN_DATA_HALF;
    case DType::bf16:
      return CUDNN_DATA_BFLOAT16;
    default:
      throw std::invalid_argument(std::string(op) + ": needs f32, f64, f16 or bf16, got " +
                                  std::string(dtype_name(dtype)));
  }
}

// The descriptors of one convolution, destroyed with it.
struct Descriptors {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnMathType_t default_math = CUDNN_DEFAULT_MATH;
  bool strict_fp32 = false;  // f32 without TF32: only FMA algorithms

  Descriptors(const Shape& xs, const Shape& ws, const Shape& ys, DType dtype, bool nhwc,
              const Conv2dParams& p, const char* op) {
    const cudnnDataType_t dt = cudnn_type(dtype, op);
    const cudnnTensorFormat_t fmt = nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    auto i = [](int64_t v) { return static_cast<int>(v); };
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&x));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&y));
    CUDNN_CHECK(cudnnCreateFilterDescriptor(&w));
    CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(x, fmt, dt, i(xs[0]), i(xs[1]), i(xs[2]), i(xs[3])));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(y, fmt, dt, i(ys[0]), i(ys[1]), i(ys[2]), i(ys[3])));
    CUDNN_CHECK(cudnnSetFilter4dDescriptor(w, dt, fmt, i(ws[0]), i(ws[1]), i(ws[2]), i(ws[3])));
    CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv, p.pad_h, p.pad_w, p.stride_h, p.stride_w, p.dilation_h,
                                                p.dilation_w, CUDNN_CROSS_CORRELATION,
                                                dtype == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT));
    CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv, p.groups));
    strict_fp32 = dtype == DType::f32 && !cuda_allow_tf32();
    if (dtype == DType::f16 || dtype == DType::bf16) default_math = CUDNN_TENSOR_OP_MATH;
    if (strict_fp32) default_math = CUDNN_FMA_MATH;
    CUDNN_CHECK(cudnnSetConvolutionMathType(conv, default_math));
  }
  ~Descriptors() {
    cudnnDestroyTensorDescriptor(x);
    cudnnDestroyTensorDescriptor(y);
    cudnnDestroyFilterDescriptor(w);
    cudnnDestroyConvolutionDescriptor(conv);
  }
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
};

Key make_key(ConvOp op, DType dtype, bool nhwc, const Shape& xs, const Shape& ws, const Conv2dParams& p) {
  return {static_cast<int64_t>(op),
          static_cast<int64_t>(dtype),
          nhwc,
          cuda_allow_tf32(),
          xs[0],
          xs[1],
          xs[2],
          xs[3],
          ws[0],
          ws[1],
          ws[2],
          ws[3],
          p.stride_h,
          p.stride_w,
          p.pad_h,
          p.pad_w,
          p.dilation_h,
          p.dilation_w,
          p.groups,
          0};
}

// Find's own status: a layout cuDNN cannot run at all is reported as "no algorithm", so that the
// caller falls back to NCHW.
#define CHECK_FIND(call)                                                      \
  do {                                                                        \
    const cudnnStatus_t status_ = (call);                                     \
    if (status_ / 1000 == CUDNN_STATUS_NOT_SUPPORTED / 1000) return Choice{}; \
    CUDNN_CHECK(status_);                                                     \
  } while (0)

// The fastest successful result of a Find call that respects strict f32.
template <class Perf>
Choice pick(const Perf* perf, int count, const Descriptors& d) {
  for (int i = 0; i < count; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    const bool tensor_op =
        perf[i].mathType == CUDNN_TENSOR_OP_MATH || perf[i].mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
    if (d.strict_fp32 && tensor_op) continue;
    return {static_cast<int>(perf[i].algo), perf[i].mathType};
  }
  return {};
}

Tensor workspace(size_t bytes) {
  return Tensor::empty({static_cast<int64_t>(bytes)}, DType::u8, cuda::current_device());
}

// The cached choice for key, or the result of find(workspace ptr, bytes) stored under it.
template <class Find>
Choice choose(const Key& key, Find&& find) {
  {
    std::lock_guard<std::mutex> lock(g_cache_mutex);
    auto it = g_cache.find(key);
    if (it != g_cache.end()) return it->second;
  }
  Tensor ws;
  size_t bytes = kFindWorkspaceBytes;
  try {
    ws = workspace(bytes);
  } catch (const std::runtime_error&) {  // short of memory: let Find try the workspace-free algorithms
    bytes = 0;
  }
  const Choice c = find(bytes ? ws.raw_data() : nullptr, bytes);
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  g_cache[key] = c;
  return c;
}

const void* one(DType dtype) {
  static const float f = 1.0f;
  static const double d = 1.0;
  return dtype == DType::f64 ? static_cast<const void*>(&d) : &f;
}
const void* zero(DType dtype) {
  static const float f = 0.0f;
  static const double d = 0.0;
  return dtype == DType::f64 ? static_cast<const void*>(&d) : &f;
}

MemoryFormat format_for(bool nhwc) { return nhwc ? MemoryFormat::channels_last : MemoryFormat::contiguous; }

// Runs `body(nhwc)` in the preferred layout, falling back to NCHW when cuDNN has nothing for NHWC;
// the result is returned in the preferred layout.
template <class Body>
Tensor with_layout_fallback(bool nhwc, DType dtype, Body&& body) {
  const bool want_nhwc = nhwc;
  if (dtype == DType::f64) nhwc = false;
  if (nhwc) {
    try {
      return body(true);
    } catch (const NoAlgorithm&) {
    }
  }
  try {
    Tensor out = body(false);
    return want_nhwc ? out.contiguous(MemoryFormat::channels_last) : out;
  } catch (const NoAlgorithm&) {
    throw std::runtime_error(
        "cuDNN has no convolution algorithm for this case. HINT: try precision = \"fp32\"");
  }
}

}  // namespace

Tensor CudaBackend::conv2d(const Tensor& x_in, const Tensor& w_in, const Tensor& bias,
                           const Conv2dParams& p) {
  using namespace cuda;
  check_device(x_in, "conv2d", "input");
  check_device(w_in, "conv2d", "weight");
  check_same_dtype(x_in, w_in, "conv2d");
  const Shape ys = check_geometry("conv2d", x_in.shape(), w_in.shape(), p);
  if (bias.defined()) {
    check_device(bias, "conv2d", "bias");
    check_same_dtype(x_in, bias, "conv2d");
    if (bias.shape() != Shape{ys[1]})
      throw std::invalid_argument("conv2d: bias has shape " + shape_str(bias.shape()) + ", expected [" +
                                  std::to_string(ys[1]) + "] for weight " + shape_str(w_in.shape()));
  }
  const DType dtype = x_in.dtype();
  const bool nhwc = x_in.suggest_memory_format() == MemoryFormat::channels_last;
  Tensor y = with_layout_fallback(nhwc, dtype, [&](bool cl) {
    const MemoryFormat f = format_for(cl);
    const Tensor x = x_in.contiguous(f), w = w_in.contiguous(f);
    Tensor out = empty(ys, dtype, f);
    if (out.numel() == 0) return out;
    Descriptors d(x.shape(), w.shape(), ys, dtype, cl, p, "conv2d");
    CudaContext& ctx = cuda_context();
    cuda_stream();
    const Choice c =
        choose(make_key(ConvOp::forward, dtype, cl, x.shape(), w.shape(), p), [&](void* ws, size_t bytes) {
          cudnnConvolutionFwdAlgoPerf_t perf[kMaxAlgos];
          int count = 0;
          CHECK_FIND(cudnnFindConvolutionForwardAlgorithmEx(ctx.cudnn, d.x, x.raw_data(), d.w, w.raw_data(),
                                                            d.conv, d.y, out.raw_data(), kMaxAlgos, &count,
                                                            perf, ws, bytes));
          return pick(perf, count, d);
        });
    if (c.algo < 0) throw NoAlgorithm{};
    const auto algo = static_cast<cudnnConvolutionFwdAlgo_t>(c.algo);
    CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, d.strict_fp32 ? CUDNN_FMA_MATH : c.math));
    size_t bytes = 0;
    CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(ctx.cudnn, d.x, d.w, d.conv, d.y, algo, &bytes));
    Tensor ws = bytes ? workspace(bytes) : Tensor();
    CUDNN_CHECK(cudnnConvolutionForward(ctx.cudnn, one(dtype), d.x, x.raw_data(), d.w, w.raw_data(), d.conv,
                                        algo, bytes ? ws.raw_data() : nullptr, bytes, zero(dtype), d.y,
                                        out.raw_data()));
    return out;
  });
  if (bias.defined()) add_channel_bias(y, bias);
  return y;
}

Tensor CudaBackend::conv2d_backward_input(const Tensor& grad_y, const Tensor& w_in, const Shape& x_shape,
                                          const Conv2dParams& p) {
  using namespace cuda;
  check_device(grad_y, "conv2d_backward_input", "grad_y");
  check_device(w_in, "conv2d_backward_input", "weight");
  check_same_dtype(grad_y, w_in, "conv2d_backward_input");
  const Shape ys = check_geometry("conv2d_backward_input", x_shape, w_in.shape(), p);
  if (grad_y.shape() != ys)
    throw std::invalid_argument("conv2d_backward_input: grad_y has shape " + shape_str(grad_y.shape()) +
                                ", the convolution's output shape is " + shape_str(ys));
  const DType dtype = grad_y.dtype();
  const bool nhwc = grad_y.suggest_memory_format() == MemoryFormat::channels_last;
  return with_layout_fallback(nhwc, dtype, [&](bool cl) {
    const MemoryFormat f = format_for(cl);
    const Tensor dy = grad_y.contiguous(f), w = w_in.contiguous(f);
    Tensor dx = empty(x_shape, dtype, f);
    if (dx.numel() == 0) return dx;
    if (dy.numel() == 0) {
      dx.zero_();
      return dx;
    }
    Descriptors d(x_shape, w.shape(), ys, dtype, cl, p, "conv2d_backward_input");
    CudaContext& ctx = cuda_context();
    cuda_stream();
    const Choice c = choose(
        make_key(ConvOp::backward_data, dtype, cl, x_shape, w.shape(), p), [&](void* ws, size_t bytes) {
          cudnnConvolutionBwdDataAlgoPerf_t perf[kMaxAlgos];
          int count = 0;
          CHECK_FIND(cudnnFindConvolutionBackwardDataAlgorithmEx(ctx.cudnn, d.w, w.raw_data(), d.y,
                                                                 dy.raw_data(), d.conv, d.x, dx.raw_data(),
                                                                 kMaxAlgos, &count, perf, ws, bytes));
          return pick(perf, count, d);
        });
    if (c.algo < 0) throw NoAlgorithm{};
    const auto algo = static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo);
    CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, d.strict_fp32 ? CUDNN_FMA_MATH : c.math));
    size_t bytes = 0;
    CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(ctx.cudnn, d.w, d.y, d.conv, d.x, algo, &bytes));
    Tensor ws = bytes ? workspace(bytes) : Tensor();
    CUDNN_CHECK(cudnnConvolutionBackwardData(ctx.cudnn, one(dtype), d.w, w.raw_data(), d.y, dy.raw_data(),
                                             d.conv, algo, bytes ? ws.raw_data() : nullptr, bytes,
                                             zero(dtype), d.x, dx.raw_data()));
    return dx;
  });
}

Tensor CudaBackend::conv2d_backward_weight(const Tensor& grad_y, const Tensor& x_in, const Shape& w_shape,
                                           const Conv2dParams& p) {
  using namespace cuda;
  check_device(grad_y, "conv2d_backward_weight", "grad_y");
  check_device(x_in, "conv2d_backward_weight", "input");
  check_same_dtype(grad_y, x_in, "conv2d_backward_weight");
  const Shape ys = check_geometry("conv2d_backward_weight", x_in.shape(), w_shape, p);
  if (grad_y.shape() != ys)
    throw std::invalid_argument("conv2d_backward_weight: grad_y has shape " + shape_str(grad_y.shape()) +
                                ", the convolution's output shape is " + shape_str(ys));
  const DType dtype = grad_y.dtype();
  const bool nhwc = x_in.suggest_memory_format() == MemoryFormat::channels_last;
  return with_layout_fallback(nhwc, dtype, [&](bool cl) {
    const MemoryFormat f = format_for(cl);
    const Tensor dy = grad_y.contiguous(f), x = x_in.contiguous(f);
    Tensor dw = empty(w_shape, dtype, f);
    if (dy.numel() == 0) {
      dw.zero_();
      return dw;
    }
    Descriptors d(x.shape(), w_shape, ys, dtype, cl, p, "conv2d_backward_weight");
    CudaContext& ctx = cuda_context();
    cuda_stream();
    const Choice c = choose(
        make_key(ConvOp::backward_filter, dtype, cl, x.shape(), w_shape, p), [&](void* ws, size_t bytes) {
          cudnnConvolutionBwdFilterAlgoPerf_t perf[kMaxAlgos];
          int count = 0;
          CHECK_FIND(cudnnFindConvolutionBackwardFilterAlgorithmEx(ctx.cudnn, d.x, x.raw_data(), d.y,
                                                                   dy.raw_data(), d.conv, d.w, dw.raw_data(),
                                                                   kMaxAlgos, &count, perf, ws, bytes));
          return pick(perf, count, d);
        });
    if (c.algo < 0) throw NoAlgorithm{};
    const auto algo = static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo);
    CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, d.strict_fp32 ? CUDNN_FMA_MATH : c.math));
    size_t bytes = 0;
    CUDNN_CHECK(
        cudnnGetConvolutionBackwardFilterWorkspaceSize(ctx.cudnn, d.x, d.y, d.conv, d.w, algo, &bytes));
    Tensor ws = bytes ? workspace(bytes) : Tensor();
    CUDNN_CHECK(cudnnConvolutionBackwardFilter(ctx.cudnn, one(dtype), d.x, x.raw_data(), d.y, dy.raw_data(),
                                               d.conv, algo, bytes ? ws.raw_data() : nullptr, bytes,
                                               zero(dtype), d.w, dw.raw_data()));
    return dw;
  });
}

}  // namespace trainer
