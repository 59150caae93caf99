#include "nn/cuda/conv_graph_api.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>

#include "nn/cuda/cuda_backend.h"

namespace trainer::cudnn_conv {

using namespace cudnn_graph;

namespace {

// Tensor unique ids in the variant pack: x (or dx), w (or dw), y (or dy).
constexpr int64_t kUids[3] = {1, 2, 3};

// Runs plan once; false when cuDNN refuses (a candidate that does not run).
bool execute_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t plan, void* const ptrs[3], void* workspace) {
  BackendDesc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  return pack && set(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, kUids) &&
         set(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptrs) &&
         set(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace) &&
         GRAPH_OK(cudnnBackendFinalize(pack.get())) &&
         GRAPH_OK(cudnnBackendExecute(handle, plan, pack.get()));
}

}  // namespace

Graph operation_graph(cudnnHandle_t handle, ConvOp op, DType dtype, bool nhwc, const Shape& xs,
                      const Shape& ws, const Shape& ys, const Conv2dParams& p, int64_t alignment) {
  Graph none;
  const cudnnDataType_t dt = cudnn_type(dtype, "conv2d");
  BackendDesc x = tensor_desc(kUids[0], dt, xs, nhwc, alignment);
  BackendDesc w = tensor_desc(kUids[1], dt, ws, nhwc, alignment);
  BackendDesc y = tensor_desc(kUids[2], dt, ys, nhwc, alignment);
  const cudnnDataType_t comp = dtype == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  BackendDesc conv = convolution_desc(p, comp);
  if (!x || !w || !y || !conv) return none;

  cudnnBackendDescriptorType_t type = CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR;
  cudnnBackendAttributeName_t a_x = CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                              a_w = CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                              a_y = CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
                              a_conv = CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                              a_alpha = CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                              a_beta = CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA;
  if (op == ConvOp::backward_data) {
    type = CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR;
    a_x = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX;
    a_w = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W;
    a_y = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY;
    a_conv = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC;
    a_alpha = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA;
    a_beta = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA;
  } else if (op == ConvOp::backward_filter) {
    type = CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR;
    a_x = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X;
    a_w = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW;
    a_y = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY;
    a_conv = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC;
    a_alpha = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA;
    a_beta = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA;
  }
  BackendDesc operation(type);
  if (!operation) return none;
  cudnnBackendDescriptor_t xd = x.get(), wd = w.get(), yd = y.get(), cd = conv.get();
  bool good = set(operation.get(), a_x, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &xd) &&
              set(operation.get(), a_w, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &wd) &&
              set(operation.get(), a_y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &yd) &&
              set(operation.get(), a_conv, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cd);
  if (dtype == DType::f64) {
    const double one = 1.0, zero = 0.0;
    good = good && set(operation.get(), a_alpha, CUDNN_TYPE_DOUBLE, 1, &one) &&
           set(operation.get(), a_beta, CUDNN_TYPE_DOUBLE, 1, &zero);
  } else {
    const float one = 1.0f, zero = 0.0f;
    good = good && set(operation.get(), a_alpha, CUDNN_TYPE_FLOAT, 1, &one) &&
           set(operation.get(), a_beta, CUDNN_TYPE_FLOAT, 1, &zero);
  }
  if (!good || !GRAPH_OK(cudnnBackendFinalize(operation.get()))) return none;

  BackendDesc graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  cudnnBackendDescriptor_t od = operation.get();
  if (!graph || !set(graph.get(), CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &od) ||
      !set(graph.get(), kGraphHandle, CUDNN_TYPE_HANDLE, 1, &handle) ||
      !GRAPH_OK(cudnnBackendFinalize(graph.get())))
    return none;
  Graph out;
  out.parts.push_back(std::move(x));
  out.parts.push_back(std::move(w));
  out.parts.push_back(std::move(y));
  out.parts.push_back(std::move(conv));
  out.parts.push_back(std::move(operation));
  out.graph = std::move(graph);
  return out;
}

bool numerics_allowed(cudnnBackendDescriptor_t cfg, DType dtype) {
  const EngineInfo info = engine_info(cfg);
  if (!info.known || info.reduced_precision) return false;
  const bool strict_fp32 = dtype == DType::f32 && !cuda_allow_tf32();
  if (info.tensor_core && (strict_fp32 || dtype == DType::f64)) return false;
  if (info.nondeterministic && cuda_deterministic()) return false;
  // Compiling kernels at run time costs seconds per shape at start-up.
  return !info.runtime_compiled || cudnn_switches().runtime_compiled_engines;
}

std::optional<GraphCandidate> graph_candidate(cudnnHandle_t handle, BackendDesc cfg, DType dtype,
                                              size_t limit) {
  if (!numerics_allowed(cfg.get(), dtype)) return std::nullopt;
  BackendDesc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  cudnnBackendDescriptor_t c = cfg.get();
  if (!plan || !set(plan.get(), kPlanHandle, CUDNN_TYPE_HANDLE, 1, &handle) ||
      !set(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c) ||
      cudnnBackendFinalize(plan.get()) != CUDNN_STATUS_SUCCESS)
    return std::nullopt;
  int64_t bytes = 0, n = 0;
  if (!GRAPH_OK(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                         CUDNN_TYPE_INT64, 1, &n, &bytes)) ||
      bytes < 0 || static_cast<size_t>(bytes) > limit)
    return std::nullopt;
  return GraphCandidate{std::move(plan), std::move(cfg), static_cast<size_t>(bytes)};
}

std::vector<GraphCandidate> heuristic_candidates(cudnnHandle_t handle, cudnnBackendDescriptor_t graph,
                                                 DType dtype, size_t limit) {
  std::vector<GraphCandidate> candidates;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    for (BackendDesc& cfg : engine_configs(graph, mode)) {
      if (candidates.size() >= kMaxCandidates) break;
      if (std::optional<GraphCandidate> c = graph_candidate(handle, std::move(cfg), dtype, limit))
        candidates.push_back(std::move(*c));
    }
    if (!candidates.empty()) break;  // the fallback list only when the heuristics gave nothing usable
  }
  return candidates;
}

std::vector<Timed> time_candidates(cudnnHandle_t handle, const std::vector<GraphCandidate>& candidates,
                                   void* const ptrs[3]) {
  if (candidates.empty()) return {};
  // Deterministic mode runs the first candidate that works (below), so it allocates only what that
  // one needs, and a failed allocation is an error: falling back to other engines would make the
  // choice depend on the free memory of the moment.
  const bool deterministic = cuda_deterministic();
  size_t max_ws = 0;
  for (const GraphCandidate& c : candidates) max_ws = std::max(max_ws, c.workspace);
  if (deterministic) max_ws = candidates.front().workspace;
  Tensor ws_tensor;
  try {
    if (max_ws) ws_tensor = workspace(max_ws);
  } catch (const std::runtime_error& e) {  // short of memory: only workspace-free candidates
    if (deterministic)
      throw std::runtime_error(
          std::string("train.deterministic: the deterministic convolution engine needs ") +
          std::to_string(max_ws) + " bytes of workspace, which could not be allocated (" + e.what() +
          "). HINT: lower data.batch_size or free GPU memory");
    max_ws = 0;
  }
  std::vector<Timed> timed;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (candidates[i].workspace > max_ws) continue;
    // Deterministic mode: the first candidate in cuDNN's heuristic order that runs (the order depends
    // only on the device, the shapes and the cuDNN version; timings differ from run to run).
    if (cuda_deterministic() && !timed.empty()) break;
    void* const wp = max_ws ? ws_tensor.raw_data() : nullptr;
    const float ms = time_calls([&] { return execute_plan(handle, candidates[i].plan.get(), ptrs, wp); });
    if (debug())
      std::fprintf(stderr, "cudnn graph:   %s ws %zu: %.4f ms\n",
                   config_signature(candidates[i].cfg.get()).c_str(), candidates[i].workspace, ms);
    if (ms < std::numeric_limits<float>::infinity())
      timed.push_back({ms, candidates[i].workspace, static_cast<int>(i)});
  }
  return timed;
}

cudnnBackendDescriptor_t graph_plan(ConvOp op, DType dtype, bool nhwc, const Shape& xs, const Shape& ws,
                                    const Shape& ys, const Conv2dParams& p, void* const ptrs[3],
                                    int64_t alignment, size_t& workspace_bytes, float& time_ms) {
  const size_t limit = workspace_limit(dtype, xs, ws, ys);
  cudnnHandle_t handle = cuda_context().cudnn;
  Graph graph = operation_graph(handle, op, dtype, nhwc, xs, ws, ys, p, alignment);
  if (!graph) return nullptr;
  std::vector<GraphCandidate> candidates = heuristic_candidates(handle, graph.graph.get(), dtype, limit);
  if (candidates.empty()) return nullptr;
  const std::vector<Timed> timed = time_candidates(handle, candidates, ptrs);
  const int pick = choose_timed(timed);
  if (pick < 0) return nullptr;
  workspace_bytes = candidates[pick].workspace;
  for (const Timed& t : timed)
    if (t.index == pick) time_ms = t.ms;
  if (debug())
    std::fprintf(stderr,
                 "cudnn graph: %s x%s w%s %s%s: %s, workspace %zu, %.4f ms (of %zu timed; the heuristics' "
                 "first %.4f ms)\n",
                 op_name(op), shape_str(xs).c_str(), shape_str(ws).c_str(), nhwc ? "nhwc" : "nchw",
                 cuda_allow_tf32() ? " tf32" : "", config_signature(candidates[pick].cfg.get()).c_str(),
                 workspace_bytes, time_ms, timed.size(),
                 timed.empty() || timed.front().index != 0 ? -1.0 : timed.front().ms);
  graph.release();
  candidates[pick].cfg.release();
  return candidates[pick].plan.release();
}

void execute_graph_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t plan, void* const ptrs[3],
                        void* workspace) {
  void* const cp[3] = {ptrs[0], ptrs[1], ptrs[2]};
  BackendDesc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  if (!pack) CUDNN_CHECK(CUDNN_STATUS_ALLOC_FAILED);
  CUDNN_CHECK(
      cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, kUids));
  CUDNN_CHECK(cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                                       3, cp));
  CUDNN_CHECK(cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1,
                                       &workspace));
  CUDNN_CHECK(cudnnBackendFinalize(pack.get()));
  CUDNN_CHECK(cudnnBackendExecute(handle, plan, pack.get()));
}

}  // namespace trainer::cudnn_conv
