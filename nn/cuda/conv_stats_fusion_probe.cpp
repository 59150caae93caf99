#include "nn/cuda/conv_stats_fusion_probe.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <stdexcept>

#include "nn/cuda/cuda_common.h"
#include "nn/cuda/cudnn_graph.h"
#include "nn/random.h"

namespace trainer::cuda {
namespace {

using namespace cudnn_graph;

// Tensor ids in the variant packs.
constexpr int64_t kX = 1, kW = 2, kY = 3, kSum = 4, kSqSum = 5, kSquare = 6;

// The operations of one fused graph and every descriptor they were built from (kept alive with them).
struct OpGraph {
  std::vector<BackendDesc> parts;
  std::vector<cudnnBackendDescriptor_t> ops;
  BackendDesc graph;
  BackendDesc& keep(BackendDesc d) {
    parts.push_back(std::move(d));
    return parts.back();
  }
  bool add_op(BackendDesc op) {
    if (!op || !GRAPH_OK(cudnnBackendFinalize(op.get()))) return false;
    ops.push_back(op.get());
    keep(std::move(op));
    return true;
  }
  bool finalize(cudnnHandle_t handle) {
    graph = BackendDesc(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    return graph &&
           set(graph.get(), CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
               static_cast<int64_t>(ops.size()), ops.data()) &&
           set(graph.get(), kGraphHandle, CUDNN_TYPE_HANDLE, 1, &handle) &&
           GRAPH_OK(cudnnBackendFinalize(graph.get()));
  }
};

cudnnDataType_t data_type(DType d) { return d == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF; }

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

// cuDNN's dedicated statistics operation (the ConvBNfprop pattern's epilogue).
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
  BackendDesc& pw = g.keep(BackendDesc(CUDNN_BACKEND_POINTWISE_DESCRIPTOR));
  const cudnnPointwiseMode_t mul = CUDNN_POINTWISE_MUL;
  const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  if (!pw || !set(pw.get(), CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mul) ||
      !set(pw.get(), CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec) ||
      !GRAPH_OK(cudnnBackendFinalize(pw.get())))
    return false;
  BackendDesc op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  cudnnBackendDescriptor_t d = pw.get();
  return op &&
         set(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d) &&
         set(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &in) &&
         set(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &in) &&
         set(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &out) &&
         g.add_op(std::move(op));
}

enum class Pattern { conv, genstats, reduction };

// The graph of `pattern` on tensors of these shapes, or an empty OpGraph with the reason in `why`.
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

// Milliseconds per call of `run` (best of 5 after a warm-up), or infinity when it fails.
float time_ms(const std::function<bool()>& run) {
  if (!run()) return std::numeric_limits<float>::infinity();
  CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  float best = std::numeric_limits<float>::infinity();
  for (int rep = 0; rep < 5; ++rep) {
    CUDA_CHECK(cudaEventRecord(a, cuda_stream()));
    const bool good = run();
    CUDA_CHECK(cudaEventRecord(b, cuda_stream()));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    if (!good) {
      best = std::numeric_limits<float>::infinity();
      break;
    }
    best = std::min(best, ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return best;
}

bool needs_runtime_compilation(cudnnBackendDescriptor_t cfg, int64_t& engine_index) {
  BackendDesc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  int64_t n = 0;
  engine_index = -1;
  if (!engine || !GRAPH_OK(cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE,
                                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, engine.addr())))
    return false;
  cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n,
                           &engine_index);
  cudnnBackendBehaviorNote_t notes[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
  int64_t count = 0;
  if (cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                               CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &count, notes) != CUDNN_STATUS_SUCCESS)
    return false;
  for (int64_t i = 0; i < count; ++i)
    if (notes[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) return true;
  return false;
}

// Every engine the heuristics offer for `pattern`, finalised and timed on these buffers.
FusionProbeRow probe(Pattern pattern, const char* name, DType dtype, const Shape& xs, const Shape& ws,
                     const Shape& ys, const Conv2dParams& p, const std::map<int64_t, void*>& buffers) {
  FusionProbeRow row;
  row.pattern = name;
  cudnnHandle_t handle = cuda_context().cudnn;
  OpGraph g = build(pattern, handle, dtype, xs, ws, ys, p);
  if (!g.graph) {
    row.note = "cuDNN refused the operation graph (TRAINER_CUDNN_DEBUG=1 names the call)";
    return row;
  }
  std::vector<int64_t> uids;
  std::vector<void*> ptrs;
  for (int64_t uid : pattern == Pattern::conv ? std::vector<int64_t>{kX, kW, kY}
                                              : std::vector<int64_t>{kX, kW, kY, kSum, kSqSum}) {
    uids.push_back(uid);
    ptrs.push_back(buffers.at(uid));
  }
  int rtc = 0;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    for (BackendDesc& cfg : engine_configs(g.graph.get(), mode)) {
      ++row.engines;
      int64_t engine = -1;
      const bool compiled = needs_runtime_compilation(cfg.get(), engine);
      BackendDesc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      cudnnBackendDescriptor_t c = cfg.get();
      if (!plan || !set(plan.get(), kPlanHandle, CUDNN_TYPE_HANDLE, 1, &handle) ||
          !set(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c) ||
          !GRAPH_OK(cudnnBackendFinalize(plan.get())))
        continue;
      int64_t bytes = 0, n = 0;
      if (!GRAPH_OK(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                             CUDNN_TYPE_INT64, 1, &n, &bytes)) ||
          bytes < 0 || bytes > (int64_t{1} << 30))
        continue;
      Tensor ws_tensor = Tensor::empty({std::max<int64_t>(bytes, 1)}, DType::u8, current_device());
      void* workspace = ws_tensor.raw_data();
      const float ms = time_ms([&] {
        BackendDesc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
        return pack &&
               set(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                   static_cast<int64_t>(uids.size()), uids.data()) &&
               set(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                   static_cast<int64_t>(ptrs.size()), ptrs.data()) &&
               set(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace) &&
               GRAPH_OK(cudnnBackendFinalize(pack.get())) &&
               GRAPH_OK(cudnnBackendExecute(handle, plan.get(), pack.get()));
      });
      cudaGetLastError();
      if (!(ms < std::numeric_limits<float>::infinity())) continue;
      ++row.runnable;
      rtc += compiled;
      if (row.best_ms < 0 || ms < row.best_ms) {
        row.best_ms = ms;
        row.best_engine = engine;
      }
    }
  }
  if (row.engines == 0)
    row.note = "the heuristics offered no engine";
  else if (row.runnable == 0)
    row.note = "no offered engine finalised and ran";
  else if (rtc)
    row.note = std::to_string(rtc) + " of them compiled at run time";
  return row;
}

}  // namespace

std::vector<FusionProbeRow> probe_conv_stats_fusion(DType dtype, const Shape& xs, const Shape& ws,
                                                    const Conv2dParams& p) {
  if (dtype != DType::bf16 && dtype != DType::f16)
    throw std::invalid_argument("probe_conv_stats_fusion: bf16 or f16, got " +
                                std::string(dtype_name(dtype)));
  const Device dev = current_device();
  const Shape ys{xs[0], ws[0],
                 conv_output_size(xs[2], static_cast<int>(ws[2]), p.stride_h, p.pad_h, p.dilation_h),
                 conv_output_size(xs[3], static_cast<int>(ws[3]), p.stride_w, p.pad_w, p.dilation_w)};
  Generator gen(1);
  Tensor x = Tensor::empty(xs, dtype, dev, MemoryFormat::channels_last);
  Tensor w = Tensor::empty(ws, dtype, dev, MemoryFormat::channels_last);
  Tensor y = Tensor::empty(ys, dtype, dev, MemoryFormat::channels_last);
  normal_(x, 0.0, 1.0, gen);
  normal_(w, 0.0, 0.05, gen);
  Tensor sum = Tensor::zeros({ys[1]}, DType::f32, dev), sqsum = Tensor::zeros({ys[1]}, DType::f32, dev);
  const std::map<int64_t, void*> buffers{{kX, x.raw_data()},
                                         {kW, w.raw_data()},
                                         {kY, y.raw_data()},
                                         {kSum, sum.raw_data()},
                                         {kSqSum, sqsum.raw_data()}};
  std::vector<FusionProbeRow> rows;
  rows.push_back(probe(Pattern::conv, "conv alone", dtype, xs, ws, ys, p, buffers));
  FusionProbeRow ours;
  ours.pattern = "our BN statistics kernel alone (bn_mean_var)";
  Backend& k = backend_for(y);
  ours.best_ms = time_ms([&] {
    k.bn_mean_var(y);
    return true;
  });
  ours.runnable = ours.engines = 1;
  rows.push_back(ours);
  rows.push_back(probe(Pattern::genstats, "conv + genstats (fused)", dtype, xs, ws, ys, p, buffers));
  rows.push_back(probe(Pattern::reduction, "conv + sum/sum-of-squares reductions (fused)", dtype, xs, ws, ys,
                       p, buffers));
  return rows;
}

}  // namespace trainer::cuda
