#include "nn/cuda/conv_legacy_api.h"

#include <cstdio>
#include <stdexcept>
#include <vector>

#include "nn/cuda/conv_timing.h"
#include "nn/cuda/cuda_backend.h"
#include "nn/cuda/cudnn_graph.h"

namespace trainer::cudnn_conv {

using cudnn_graph::debug;

Descriptors::Descriptors(const Shape& xs, const Shape& ws, const Shape& ys, DType dtype, bool nhwc,
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
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  if (dtype == DType::f16 || dtype == DType::bf16 || (dtype == DType::f32 && !strict_fp32))
    math = CUDNN_TENSOR_OP_MATH;
  if (strict_fp32) math = CUDNN_FMA_MATH;
  CUDNN_CHECK(cudnnSetConvolutionMathType(conv, math));
}

Descriptors::~Descriptors() {
  cudnnDestroyTensorDescriptor(x);
  cudnnDestroyTensorDescriptor(y);
  cudnnDestroyFilterDescriptor(w);
  cudnnDestroyConvolutionDescriptor(conv);
}

namespace {

constexpr int kMaxAlgos = 16;

// Find's own status: a layout cuDNN cannot run at all is reported as "no algorithm", so that the
// caller falls back to NCHW.
#define CHECK_FIND(call)                                                  \
  do {                                                                    \
    const cudnnStatus_t status_ = (call);                                 \
    if (status_ / 1000 == CUDNN_STATUS_NOT_SUPPORTED / 1000) return plan; \
    CUDNN_CHECK(status_);                                                 \
  } while (0)

// The legacy algorithm for the convolution (plan->none when the layout has none).
template <class Perf>
void pick_legacy(Plan& plan, const Perf* perf, int count, size_t limit, float& time_ms) {
  std::vector<Timed> timed;
  for (int i = 0; i < count; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > limit) continue;
    const bool tensor_op =
        perf[i].mathType == CUDNN_TENSOR_OP_MATH || perf[i].mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
    if (plan.legacy->strict_fp32 && tensor_op) continue;
    if (perf[i].mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) continue;  // would round f32 inputs to f16
    if (cuda_deterministic() && perf[i].determinism != CUDNN_DETERMINISTIC) continue;
    timed.push_back({perf[i].time, perf[i].memory, i});
  }
  // Deterministic mode: the lowest algorithm number, not the fastest (Find's timings vary by run).
  int i = -1;
  if (cuda_deterministic()) {
    for (const Timed& t : timed)
      if (i < 0 || perf[t.index].algo < perf[i].algo) i = t.index;
  } else {
    i = choose_timed(timed);
  }
  if (i < 0) return;
  plan.none = false;
  plan.algo = static_cast<int>(perf[i].algo);
  plan.math = plan.legacy->strict_fp32 ? CUDNN_FMA_MATH : perf[i].mathType;
  plan.workspace = perf[i].memory;
  time_ms = perf[i].time;
  CUDNN_CHECK(cudnnSetConvolutionMathType(plan.legacy->conv, plan.math));
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

}  // namespace

std::unique_ptr<Plan> legacy_plan(ConvOp op, DType dtype, bool nhwc, const Shape& xs, const Shape& wsh,
                                  const Shape& ys, const Conv2dParams& p, void* const ptrs[3],
                                  float& time_ms) {
  auto plan = std::make_unique<Plan>();
  plan->none = true;
  plan->legacy = std::make_unique<Descriptors>(xs, wsh, ys, dtype, nhwc, p, "conv2d");
  const Descriptors& d = *plan->legacy;
  cudnnHandle_t h = cuda_context().cudnn;
  Tensor ws;
  const size_t limit = workspace_limit(dtype, xs, wsh, ys);
  size_t bytes = limit;
  try {
    ws = workspace(bytes);
  } catch (const std::runtime_error&) {  // short of memory: let Find try the workspace-free algorithms
    bytes = 0;
  }
  void* wp = bytes ? ws.raw_data() : nullptr;
  int count = 0;
  if (op == ConvOp::forward) {
    cudnnConvolutionFwdAlgoPerf_t perf[kMaxAlgos];
    CHECK_FIND(cudnnFindConvolutionForwardAlgorithmEx(h, d.x, ptrs[0], d.w, ptrs[1], d.conv, d.y, ptrs[2],
                                                      kMaxAlgos, &count, perf, wp, bytes));
    pick_legacy(*plan, perf, count, limit, time_ms);
  } else if (op == ConvOp::backward_data) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[kMaxAlgos];
    CHECK_FIND(cudnnFindConvolutionBackwardDataAlgorithmEx(h, d.w, ptrs[1], d.y, ptrs[2], d.conv, d.x,
                                                           ptrs[0], kMaxAlgos, &count, perf, wp, bytes));
    pick_legacy(*plan, perf, count, limit, time_ms);
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[kMaxAlgos];
    CHECK_FIND(cudnnFindConvolutionBackwardFilterAlgorithmEx(h, d.x, ptrs[0], d.y, ptrs[2], d.conv, d.w,
                                                             ptrs[1], kMaxAlgos, &count, perf, wp, bytes));
    pick_legacy(*plan, perf, count, limit, time_ms);
  }
  if (debug())
    std::fprintf(stderr, "cudnn legacy: %s x%s w%s %s%s: algo %d math %d, workspace %zu, %.4f ms\n",
                 op_name(op), shape_str(xs).c_str(), shape_str(wsh).c_str(), nhwc ? "nhwc" : "nchw",
                 cuda_allow_tf32() ? " tf32" : "", plan->algo, static_cast<int>(plan->math), plan->workspace,
                 time_ms);
  return plan;
}

void execute_legacy(const Plan& plan, ConvOp op, DType dtype, void* const ptrs[3], void* wp) {
  cudnnHandle_t handle = cuda_context().cudnn;
  const Descriptors& d = *plan.legacy;
  const size_t bytes = plan.workspace;
  if (op == ConvOp::forward)
    CUDNN_CHECK(cudnnConvolutionForward(handle, one(dtype), d.x, ptrs[0], d.w, ptrs[1], d.conv,
                                        static_cast<cudnnConvolutionFwdAlgo_t>(plan.algo), wp, bytes,
                                        zero(dtype), d.y, ptrs[2]));
  else if (op == ConvOp::backward_data)
    CUDNN_CHECK(cudnnConvolutionBackwardData(handle, one(dtype), d.w, ptrs[1], d.y, ptrs[2], d.conv,
                                             static_cast<cudnnConvolutionBwdDataAlgo_t>(plan.algo), wp, bytes,
                                             zero(dtype), d.x, ptrs[0]));
  else
    CUDNN_CHECK(cudnnConvolutionBackwardFilter(handle, one(dtype), d.x, ptrs[0], d.y, ptrs[2], d.conv,
                                               static_cast<cudnnConvolutionBwdFilterAlgo_t>(plan.algo), wp,
                                               bytes, zero(dtype), d.w, ptrs[1]));
}

}  // namespace trainer::cudnn_conv
