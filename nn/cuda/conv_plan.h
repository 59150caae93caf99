#pragma once
// How one cuDNN convolution runs (a Plan: a graph-API execution plan or a legacy algorithm with its
// descriptors), and what the files that build and run plans share: the operation, cuDNN's data type
// and the workspace. nn/cuda/conv_plan_cache.h chooses a plan by timing the graph API's candidates
// (nn/cuda/conv_graph_api.h) against the legacy API's (nn/cuda/conv_legacy_api.h).
//
// A workspace may be at most four times the largest operand or 256 MiB, whichever is larger: the
// tensor-core engines on NCHW data transpose the operands into it (resnet18-cifar at batch 512 needs
// just over twice its 128 MiB first-stage activation; a tighter cap left only much slower FMA
// kernels: figures in bench/PERF_NOTES.md, "Figures moved out of headers"). Workspaces come from the
// caching allocator and live only during the call.
#include <cudnn.h>

#include <cstddef>
#include <memory>

#include "nn/backend.h"
#include "nn/tensor.h"

namespace trainer::cudnn_conv {

enum class ConvOp : int { forward, backward_data, backward_filter };
// "fwd", "bwd_data" or "bwd_filter", for debug output.
const char* op_name(ConvOp op);

// cuDNN's data type for dtype; throws, naming op, unless dtype is f32, f64, f16 or bf16.
cudnnDataType_t cudnn_type(DType dtype, const char* op);

// The legacy descriptors of one convolution, destroyed with it (made in nn/cuda/conv_legacy_api.cpp).
struct Descriptors {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  bool strict_fp32 = false;  // f32 without TF32: only FMA algorithms

  Descriptors(const Shape& xs, const Shape& ws, const Shape& ys, DType dtype, bool nhwc,
              const Conv2dParams& p, const char* op);
  ~Descriptors();
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
};

// How one convolution runs: built once per key (nn/cuda/conv_plan_cache.h), then run per call.
struct Plan {
  bool none = false;                         // nothing runs in this layout
  cudnnBackendDescriptor_t graph = nullptr;  // graph-API execution plan, or
  std::unique_ptr<Descriptors> legacy;       // legacy descriptors + algorithm
  int algo = -1;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  size_t workspace = 0;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {  // only a plan that lost the comparison: cached ones live as long as the process
    if (graph) cudnnBackendDestroyDescriptor(graph);
  }
};

// A workspace of `bytes` from the caching allocator.
Tensor workspace(size_t bytes);

// The largest workspace a candidate may ask for (see the top of the file).
size_t workspace_limit(DType dtype, const Shape& xs, const Shape& ws, const Shape& ys);

}  // namespace trainer::cudnn_conv
