#include "nn/cuda/conv_stats_graph.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <limits>

#include "nn/cuda/cuda_common.h"

namespace trainer::cuda::conv_stats {

using namespace cudnn_graph;

BackendDesc& OpGraph::keep(BackendDesc d) {
  parts.push_back(std::move(d));
  return parts.back();
}

bool OpGraph::add_op(BackendDesc op) {
  if (!op || !GRAPH_OK(cudnnBackendFinalize(op.get()))) return false;
  ops.push_back(op.get());
  keep(std::move(op));
  return true;
}

bool OpGraph::finalize(cudnnHandle_t handle) {
  graph = BackendDesc(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  return graph &&
         set(graph.get(), CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
             static_cast<int64_t>(ops.size()), ops.data()) &&
         set(graph.get(), kGraphHandle, CUDNN_TYPE_HANDLE, 1, &handle) &&
         GRAPH_OK(cudnnBackendFinalize(graph.get()));
}

bool add_conv_forward(OpGraph& g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t w,
                      cudnnBackendDescriptor_t y, const Conv2dParams& p) {
  BackendDesc& conv = g.keep(convolution_desc(p, CUDNN_DATA_FLOAT));
  if (!conv) return false;
  BackendDesc op(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
  cudnnBackendDescriptor_t c = conv.get();
  const float one = 1.0f, zero = 0.0f;
  return op &&
         set(op.get(), CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x) &&
         set(op.get(), CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w) &&
         set(op.get(), CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y) &&
         set(op.get(), CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
             &c) &&
         set(op.get(), CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &one) &&
         set(op.get(), CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &zero) &&
         g.add_op(std::move(op));
}

bool add_genstats(OpGraph& g, cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t sum,
                  cudnnBackendDescriptor_t sqsum) {
  BackendDesc op(CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR);
  const cudnnGenStatsMode_t mode = CUDNN_GENSTATS_SUM_SQSUM;
  const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  return op && set(op.get(), CUDNN_ATTR_OPERATION_GENSTATS_MODE, CUDNN_TYPE_GENSTATS_MODE, 1, &mode) &&
         set(op.get(), CUDNN_ATTR_OPERATION_GENSTATS_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec) &&
         set(op.get(), CUDNN_ATTR_OPERATION_GENSTATS_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y) &&
         set(op.get(), CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &sum) &&
         set(op.get(), CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &sqsum) &&
         g.add_op(std::move(op));
}

bool add_pointwise(OpGraph& g, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t in,
                   cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t out) {
  BackendDesc& pw = g.keep(BackendDesc(CUDNN_BACKEND_POINTWISE_DESCRIPTOR));
  const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  if (!pw || !set(pw.get(), CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode) ||
      !set(pw.get(), CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec) ||
      !GRAPH_OK(cudnnBackendFinalize(pw.get())))
    return false;
  BackendDesc op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  cudnnBackendDescriptor_t d = pw.get();
  return op &&
         set(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d) &&
         set(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &in) &&
         (!b || set(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b)) &&
         set(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &out) &&
         g.add_op(std::move(op));
}

namespace {

cudnnDataType_t data_type(DType d) { return d == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF; }

// A per-channel sum (reduction over N, H, W) in f32: what the runtime-fusion engines take.
bool add_channel_sum(OpGraph& g, cudnnBackendDescriptor_t in, cudnnBackendDescriptor_t out) {
  BackendDesc& reduction = g.keep(BackendDesc(CUDNN_BACKEND_REDUCTION_DESCRIPTOR));
  const cudnnReduceTensorOp_t add = CUDNN_REDUCE_TENSOR_ADD;
  const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  if (!reduction ||
      !set(reduction.get(), CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &add) ||
      !set(reduction.get(), CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &prec) ||
      !GRAPH_OK(cudnnBackendFinalize(reduction.get())))
    return false;
  BackendDesc op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
  cudnnBackendDescriptor_t r = reduction.get();
  return op && set(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &in) &&
         set(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &out) &&
         set(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r) &&
         g.add_op(std::move(op));
}

// out = in * in, elementwise in f32.
bool add_square(OpGraph& g, cudnnBackendDescriptor_t in, cudnnBackendDescriptor_t out) {
  return add_pointwise(g, CUDNN_POINTWISE_MUL, in, in, out);
}

}  // namespace

OpGraph build(Pattern pattern, cudnnHandle_t handle, DType dtype, const Shape& xs, const Shape& ws,
              const Shape& ys, const Conv2dParams& p) {
  OpGraph g;
  const cudnnDataType_t dt = data_type(dtype);
  const Shape stats{1, ys[1], 1, 1};
  cudnnBackendDescriptor_t x = g.keep(tensor_desc(kX, dt, xs, true, 16)).get();
  cudnnBackendDescriptor_t w = g.keep(tensor_desc(kW, dt, ws, true, 16)).get();
  cudnnBackendDescriptor_t y = g.keep(tensor_desc(kY, dt, ys, true, 16)).get();
  cudnnBackendDescriptor_t sum = g.keep(tensor_desc(kSum, CUDNN_DATA_FLOAT, stats, true, 16)).get();
  cudnnBackendDescriptor_t sqsum = g.keep(tensor_desc(kSqSum, CUDNN_DATA_FLOAT, stats, true, 16)).get();
  cudnnBackendDescriptor_t square =
      g.keep(tensor_desc(kSquare, CUDNN_DATA_FLOAT, ys, true, 16, /*is_virtual=*/true)).get();
  bool good = x && w && y && sum && sqsum && square && add_conv_forward(g, x, w, y, p);
  if (pattern == Pattern::genstats) good = good && add_genstats(g, y, sum, sqsum);
  if (pattern == Pattern::reduction)
    good =
        good && add_channel_sum(g, y, sum) && add_square(g, y, square) && add_channel_sum(g, square, sqsum);
  if (!good || !g.finalize(handle)) return OpGraph();
  return g;
}

std::vector<int64_t> pack_uids(Pattern pattern) {
  if (pattern == Pattern::conv) return {kX, kW, kY};
  return {kX, kW, kY, kSum, kSqSum};
}

std::optional<Plan> finalize_plan(cudnnBackendDescriptor_t cfg, int64_t max_workspace) {
  cudnnHandle_t handle = cuda_context().cudnn;
  Plan p;
  p.plan = BackendDesc(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  int64_t n = 0;
  if (!p.plan || !set(p.plan.get(), kPlanHandle, CUDNN_TYPE_HANDLE, 1, &handle) ||
      !set(p.plan.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg) ||
      !GRAPH_OK(cudnnBackendFinalize(p.plan.get())) ||
      !GRAPH_OK(cudnnBackendGetAttribute(p.plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                         CUDNN_TYPE_INT64, 1, &n, &p.workspace_bytes)) ||
      p.workspace_bytes < 0 || p.workspace_bytes > max_workspace)
    return std::nullopt;
  return p;
}

bool Plan::execute(const std::vector<int64_t>& uids, const std::vector<void*>& ptrs, void* workspace) const {
  BackendDesc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  return pack &&
         set(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
             static_cast<int64_t>(uids.size()), uids.data()) &&
         set(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
             static_cast<int64_t>(ptrs.size()), ptrs.data()) &&
         set(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace) &&
         GRAPH_OK(cudnnBackendFinalize(pack.get())) &&
         GRAPH_OK(cudnnBackendExecute(cuda_context().cudnn, plan.get(), pack.get()));
}

namespace {
// Two CUDA events, destroyed with their owner.
struct EventPair {
  cudaEvent_t a = nullptr, b = nullptr;
  EventPair() {
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
  }
  ~EventPair() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
};

}  // namespace

float time_per_call_ms(const std::function<bool()>& run, int runs, int rounds) {
  const float fail = std::numeric_limits<float>::infinity();
  if (!run()) return fail;
  CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
  EventPair events;
  float best = fail;
  for (int round = 0; round < rounds; ++round) {
    CUDA_CHECK(cudaEventRecord(events.a, cuda_stream()));
    for (int i = 0; i < runs; ++i)
      if (!run()) return fail;
    CUDA_CHECK(cudaEventRecord(events.b, cuda_stream()));
    CUDA_CHECK(cudaEventSynchronize(events.b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, events.a, events.b));
    best = std::min(best, ms / runs);
  }
  return best;
}

}  // namespace trainer::cuda::conv_stats
