#include "nn/cuda/conv_stats_fusion_probe.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
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

// Milliseconds per call of `run`: kRuns calls back to back between two events (so the GPU never waits
// for the host and a call's launch latency hides behind the previous one, as in a training step),
// best of three such rounds after a warm-up; infinity when a call fails.
constexpr int kRuns = 50;
float time_ms(const std::function<bool()>& run) {
  const float fail = std::numeric_limits<float>::infinity();
  if (!run()) return fail;
  CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
  EventPair events;
  float best = fail;
  for (int round = 0; round < 3; ++round) {
    CUDA_CHECK(cudaEventRecord(events.a, cuda_stream()));
    for (int i = 0; i < kRuns; ++i)
      if (!run()) return fail;
    CUDA_CHECK(cudaEventRecord(events.b, cuda_stream()));
    CUDA_CHECK(cudaEventSynchronize(events.b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, events.a, events.b));
    best = std::min(best, ms / kRuns);
  }
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

// A finalised plan with its workspace and variant pack, ready to execute.
struct Runnable {
  BackendDesc plan, pack;
  Tensor workspace;
  bool execute() const { return GRAPH_OK(cudnnBackendExecute(cuda_context().cudnn, plan.get(), pack.get())); }
};

// The plan of engine configuration cfg with its pack over `ptrs`, or nothing when it does not finalise.
std::optional<Runnable> runnable(cudnnBackendDescriptor_t cfg, const std::vector<int64_t>& uids,
                                 const std::vector<void*>& ptrs) {
  cudnnHandle_t handle = cuda_context().cudnn;
  Runnable r;
  r.plan = BackendDesc(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  if (!r.plan || !set(r.plan.get(), kPlanHandle, CUDNN_TYPE_HANDLE, 1, &handle) ||
      !set(r.plan.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg) ||
      !GRAPH_OK(cudnnBackendFinalize(r.plan.get())))
    return std::nullopt;
  int64_t bytes = 0, n = 0;
  if (!GRAPH_OK(cudnnBackendGetAttribute(r.plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                         CUDNN_TYPE_INT64, 1, &n, &bytes)) ||
      bytes < 0 || bytes > (int64_t{1} << 30))
    return std::nullopt;
  r.workspace = Tensor::empty({std::max<int64_t>(bytes, 1)}, DType::u8, current_device());
  void* workspace = r.workspace.raw_data();
  r.pack = BackendDesc(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  if (!r.pack ||
      !set(r.pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
           static_cast<int64_t>(uids.size()), uids.data()) ||
      !set(r.pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
           static_cast<int64_t>(ptrs.size()), ptrs.data()) ||
      !set(r.pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace) ||
      !GRAPH_OK(cudnnBackendFinalize(r.pack.get())))
    return std::nullopt;
  return r;
}

// Every engine the heuristics offer for `pattern` (each engine once, though both heuristics modes may
// list it), finalised and timed on these buffers. `best` receives the fastest.
FusionProbeRow probe(Pattern pattern, const char* name, DType dtype, const Shape& xs, const Shape& ws,
                     const Shape& ys, const Conv2dParams& p, const std::map<int64_t, void*>& buffers,
                     std::optional<Runnable>& best) {
  FusionProbeRow row;
  row.pattern = name;
  OpGraph g = build(pattern, cuda_context().cudnn, dtype, xs, ws, ys, p);
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
  double finalize_s = 0.0;
  std::set<int64_t> seen;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    for (BackendDesc& cfg : engine_configs(g.graph.get(), mode)) {
      int64_t engine = -1;
      const bool compiled = needs_runtime_compilation(cfg.get(), engine);
      if (!seen.insert(engine).second) continue;
      ++row.engines;
      const auto finalize_start = std::chrono::steady_clock::now();
      std::optional<Runnable> r = runnable(cfg.get(), uids, ptrs);
      if (!r) continue;
      // Finalising a plan is where a runtime-fusion engine compiles its kernel: a training run would
      // pay this at start-up for every shape and every engine it times.
      finalize_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - finalize_start).count();
      const float ms = time_ms([&] { return r->execute(); });
      cudaGetLastError();
      if (!(ms < std::numeric_limits<float>::infinity())) continue;
      ++row.runnable;
      rtc += compiled;
      if (row.best_ms < 0 || ms < row.best_ms) {
        row.best_ms = ms;
        row.best_engine = engine;
        best = std::move(r);
      }
    }
  }
  if (row.engines == 0)
    row.note = "the heuristics offered no engine";
  else if (row.runnable == 0)
    row.note = "no offered engine finalised and ran";
  else if (rtc)
    row.note = std::to_string(rtc) + " of them compiled at run time";
  char finalize[64];
  std::snprintf(finalize, sizeof finalize, "%sfinalising took %.2f s", row.note.empty() ? "" : "; ",
                finalize_s);
  row.note += finalize;
  return row;
}

// How far the fused statistics are from ours: the largest difference of the means over the largest
// |mean|, and the largest relative difference of the (biased) variances.
std::string compare_statistics(const Tensor& sum, const Tensor& sqsum, const std::pair<Tensor, Tensor>& ours,
                               int64_t count) {
  const std::vector<float> s = sum.to_vector<float>(), q = sqsum.to_vector<float>();
  const std::vector<float> m = ours.first.to(DType::f32).to_vector<float>(),
                           v = ours.second.to(DType::f32).to_vector<float>();
  double mean_diff = 0, mean_max = 0, var_rel = 0;
  for (size_t c = 0; c < s.size(); ++c) {
    const double mean = s[c] / static_cast<double>(count);
    const double var = q[c] / static_cast<double>(count) - mean * mean;
    mean_diff = std::max(mean_diff, std::abs(mean - m[c]));
    mean_max = std::max(mean_max, std::abs(static_cast<double>(m[c])));
    var_rel = std::max(var_rel, std::abs(var - v[c]) / std::max(1e-30, std::abs(static_cast<double>(v[c]))));
  }
  char buf[160];
  std::snprintf(buf, sizeof buf, "; vs ours: mean %.1e (of max |mean| %.2g), var %.1e relative", mean_diff,
                mean_max, var_rel);
  return buf;
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
  std::optional<Runnable> conv;
  rows.push_back(probe(Pattern::conv, "conv alone", dtype, xs, ws, ys, p, buffers, conv));
  Backend& k = backend_for(y);
  FusionProbeRow stats;
  stats.pattern = "our statistics kernel alone (bn_mean_var)";
  stats.best_ms = time_ms([&] {
    k.bn_mean_var(y);
    return true;
  });
  stats.runnable = stats.engines = 1;
  rows.push_back(stats);
  if (conv) {  // what a training step runs today: the two back to back
    FusionProbeRow ours;
    ours.pattern = "ours: conv, then bn_mean_var";
    ours.best_ms = time_ms([&] {
      if (!conv->execute()) return false;
      k.bn_mean_var(y);
      return true;
    });
    ours.runnable = ours.engines = 1;
    rows.push_back(ours);
  }
  const int64_t count = ys[0] * ys[2] * ys[3];
  for (auto [pattern, name] :
       {std::pair{Pattern::genstats, "conv + genstats (fused)"},
        std::pair{Pattern::reduction, "conv + sum/sum-of-squares reductions (fused)"}}) {
    std::optional<Runnable> fused;
    FusionProbeRow row = probe(pattern, name, dtype, xs, ws, ys, p, buffers, fused);
    if (fused && conv) {  // the statistics of the same output, fused and ours
      sum.zero_();
      sqsum.zero_();
      if (conv->execute() && fused->execute())
        row.note += compare_statistics(sum, sqsum, k.bn_mean_var(y), count);
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace trainer::cuda
