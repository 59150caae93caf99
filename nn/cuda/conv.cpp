// 2-D convolution and both backwards through cuDNN: the backend's entry points. Host code only (cuDNN
// calls), so a .cpp file.
//
// Layout: NCHW or NHWC (channels_last), following the input (forward, weight gradient) or grad_y
// (input gradient); the weight is laid out to match and results come back in that memory format.
// f64 runs in NCHW (cuDNN has no NHWC double kernels), as does any shape whose NHWC form cuDNN
// cannot run.
//
// How a convolution runs is chosen once per shape and cached (nn/cuda/conv_plan_cache.h) among cuDNN's
// graph API (nn/cuda/conv_graph_api.h) and legacy API (nn/cuda/conv_legacy_api.h) candidates; a stem
// with few input channels may run as im2col + GEMM instead (nn/cuda/im2col_conv.h), and a channels-last
// depthwise convolution (ConvNeXt's 7x7) runs on our own kernels (nn/cuda/depthwise_conv.h).
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>

#include "nn/cuda/conv_geometry.h"
#include "nn/cuda/conv_graph_api.h"
#include "nn/cuda/conv_legacy_api.h"
#include "nn/cuda/conv_plan_cache.h"
#include "nn/cuda/conv_stats_fusion.h"
#include "nn/cuda/cuda_common.h"
#include "nn/cuda/depthwise_conv.h"
#include "nn/cuda/im2col_conv.h"

namespace trainer {

using namespace cudnn_conv;

namespace {

struct NoAlgorithm {};  // thrown when cuDNN has no algorithm for a layout; the caller retries in NCHW

// Runs the convolution of op on ptrs = {x or dx, w or dw, y or dy}; throws NoAlgorithm when the
// layout has none.
void run_conv(ConvOp op, DType dtype, bool nhwc, const Shape& xs, const Shape& wsh, const Shape& ys,
              const Conv2dParams& p, void* const ptrs[3]) {
  const Plan& plan = plan_for(op, dtype, nhwc, xs, wsh, ys, p, ptrs);
  if (plan.none) throw NoAlgorithm{};
  CudaContext& ctx = cuda_context();
  cuda_stream();
  Tensor ws = plan.workspace ? workspace(plan.workspace) : Tensor();
  void* wp = plan.workspace ? ws.raw_data() : nullptr;
  if (plan.graph) {
    execute_graph_plan(ctx.cudnn, plan.graph, ptrs, wp);
    return;
  }
  execute_legacy(plan, op, dtype, ptrs, wp);
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

// conv2d_backward_weight's arguments (grad_y and x on this device, one dtype, grad_y of the
// convolution's output shape); returns that shape.
Shape check_backward_weight_args(const Tensor& grad_y, const Tensor& x, const Shape& w_shape,
                                 const Conv2dParams& p) {
  using namespace cuda;
  check_device(grad_y, "conv2d_backward_weight", "grad_y");
  check_device(x, "conv2d_backward_weight", "input");
  check_same_dtype(grad_y, x, "conv2d_backward_weight");
  const Shape ys = check_geometry("conv2d_backward_weight", x.shape(), w_shape, p);
  if (grad_y.shape() != ys)
    throw std::invalid_argument("conv2d_backward_weight: grad_y has shape " + shape_str(grad_y.shape()) +
                                ", the convolution's output shape is " + shape_str(ys));
  return ys;
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
  const std::function<Tensor()> cudnn = [&] {
    return with_layout_fallback(nhwc, dtype, [&](bool cl) {
      const MemoryFormat f = format_for(cl);
      const Tensor x = x_in.contiguous(f), w = w_in.contiguous(f);
      Tensor out = empty(ys, dtype, f);
      if (out.numel() == 0) return out;
      void* const ptrs[3] = {x.raw_data(), w.raw_data(), out.raw_data()};
      run_conv(ConvOp::forward, dtype, cl, x.shape(), w.shape(), ys, p, ptrs);
      return out;
    });
  };
  const bool depthwise = depthwise_conv_applies(x_in, x_in.shape(), w_in.shape(), p);
  // A stem with few input channels may run faster as im2col + GEMM (nn/cuda/im2col_conv.h).
  const auto plain = [&] {
    if (depthwise) return depthwise_conv_forward(x_in, w_in, Tensor(), p);
    std::optional<Tensor> y = im2col_conv_forward(x_in, w_in, p, ys, cudnn);
    return y ? *y : cudnn();
  };
  // train.cudnn_fusion: a convolution feeding a training BatchNorm may also sum its output per channel.
  if (std::optional<Tensor> fused = conv2d_with_channel_sums(x_in, w_in, bias.defined(), p, ys, plain))
    return *fused;
  if (depthwise) return depthwise_conv_forward(x_in, w_in, bias, p);  // the bias added in the same pass
  Tensor y = plain();
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
  if (depthwise_conv_applies(grad_y, x_shape, w_in.shape(), p))
    return depthwise_conv_backward_input(grad_y, w_in, x_shape, p);
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
    void* const ptrs[3] = {dx.raw_data(), w.raw_data(), dy.raw_data()};
    run_conv(ConvOp::backward_data, dtype, cl, x_shape, w.shape(), ys, p, ptrs);
    return dx;
  });
}

Tensor CudaBackend::conv2d_backward_weight(const Tensor& grad_y, const Tensor& x_in, const Shape& w_shape,
                                           const Conv2dParams& p) {
  using namespace cuda;
  const Shape ys = check_backward_weight_args(grad_y, x_in, w_shape, p);
  const DType dtype = grad_y.dtype();
  const bool nhwc = x_in.suggest_memory_format() == MemoryFormat::channels_last;
  if (depthwise_conv_applies(x_in, x_in.shape(), w_shape, p))
    return depthwise_conv_backward_weight(grad_y, x_in, w_shape, p, format_for(nhwc));
  const std::function<Tensor()> cudnn = [&] {
    return with_layout_fallback(nhwc, dtype, [&](bool cl) {
      const MemoryFormat f = format_for(cl);
      const Tensor dy = grad_y.contiguous(f), x = x_in.contiguous(f);
      Tensor dw = empty(w_shape, dtype, f);
      if (dy.numel() == 0) {
        dw.zero_();
        return dw;
      }
      void* const ptrs[3] = {x.raw_data(), dw.raw_data(), dy.raw_data()};
      run_conv(ConvOp::backward_filter, dtype, cl, x.shape(), w_shape, ys, p, ptrs);
      return dw;
    });
  };
  std::optional<Tensor> dw = im2col_conv_backward_weight(grad_y, x_in, w_shape, p, format_for(nhwc), cudnn);
  return dw ? *dw : cudnn();
}

std::optional<std::pair<Tensor, Tensor>> CudaBackend::conv2d_weight_and_bias_grads_fused(
    const Tensor& grad_y, const Tensor& x, const Shape& w_shape, const Conv2dParams& p) {
  using namespace cuda;
  if (!depthwise_conv_applies(x, x.shape(), w_shape, p)) return std::nullopt;
  check_backward_weight_args(grad_y, x, w_shape, p);
  Tensor grad_bias;
  const bool nhwc = x.suggest_memory_format() == MemoryFormat::channels_last;
  Tensor grad_w = depthwise_conv_backward_weight(grad_y, x, w_shape, p, format_for(nhwc), &grad_bias);
  return std::make_pair(grad_w, grad_bias);
}

}  // namespace trainer
