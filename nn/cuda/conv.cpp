// 2-D convolution and both backwards through cuDNN. Host code only (cuDNN calls), so a .cpp file.
//
// Layout: NCHW or NHWC (channels_last), following the input (forward, weight gradient) or grad_y
// (input gradient); the weight is laid out to match and results come back in that memory format.
// f64 runs in NCHW (cuDNN has no NHWC double kernels), as does any shape whose NHWC form cuDNN
// cannot run.
//
// How a convolution runs is decided once per (op, shapes, params, dtype, layout, TF32 setting,
// pointer alignment) by timing candidates on the call's own buffers, and cached as a Plan:
//  - cuDNN's graph API: the heuristics' engine configurations that respect the numerics (no TF32
//    unless cuda_set_allow_tf32(true), never down-converted inputs or reduced-precision
//    reductions) are finalised and timed. This reaches the tensor-core engines that PyTorch uses
//    (with TF32 the legacy API mostly offers FMA kernels), and a cached execution plan costs one
//    cudnnBackendExecute per call;
//  - the legacy API's cudnnFind*AlgorithmEx, which also times FFT and Winograd algorithms that the
//    heuristics leave out (the fastest in strict f32); its descriptors are kept in the plan.
// The fastest candidate wins, or the one with the smallest workspace among those within 5% of it.
// A workspace may be at most four times the largest operand or 256 MiB, whichever is larger: the
// tensor-core engines on NCHW data transpose the operands into it (resnet18-cifar at batch 512
// needs just over twice its 128 MiB first-stage activation; capped at 256 MiB only FMA kernels
// remained there, 5x slower).
// Workspaces come from the caching allocator and live only during the call.
// TRAINER_CUDNN_API=legacy|graph uses one API only; TRAINER_CUDNN_RTC=1 also tries engines that
// compile kernels at run time (seconds per shape at start-up); TRAINER_CUDNN_DEBUG=1 prints every
// candidate and choice.
#include <algorithm>
#include <array>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "nn/cuda/conv_stats_fusion.h"
#include "nn/cuda/cuda_common.h"
#include "nn/cuda/cudnn_graph.h"
#include "nn/cuda/cudnn_switches.h"

namespace trainer {
namespace {

using namespace cudnn_graph;

constexpr size_t kMinWorkspaceLimit = size_t{256} << 20;
constexpr int kMaxAlgos = 16;
// Graph-API engine configurations timed per convolution: the heuristics' first. A wider search (mode
// B's list and the configurations' knob neighbours, bench/cudnn_knob_probe) found nothing faster on an
// H200 with cuDNN 9.19 (bench/PERF_NOTES.md, v11).
constexpr size_t kMaxCandidates = 10;
constexpr double kWorkspaceSlack = 1.05;

enum class ConvOp : int { forward, backward_data, backward_filter };
const char* op_name(ConvOp op) {
  return op == ConvOp::forward ? "fwd" : op == ConvOp::backward_data ? "bwd_data" : "bwd_filter";
}

struct NoAlgorithm {};  // thrown when cuDNN has no algorithm for a layout; the caller retries in NCHW

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

// ---- legacy API

// The legacy descriptors of one convolution, destroyed with it.
struct Descriptors {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
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
    cudnnMathType_t math = CUDNN_DEFAULT_MATH;
    if (dtype == DType::f16 || dtype == DType::bf16 || (dtype == DType::f32 && !strict_fp32))
      math = CUDNN_TENSOR_OP_MATH;
    if (strict_fp32) math = CUDNN_FMA_MATH;
    CUDNN_CHECK(cudnnSetConvolutionMathType(conv, math));
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

// ---- graph API (helpers in nn/cuda/cudnn_graph.h)

// Tensor unique ids in the variant pack: x (or dx), w (or dw), y (or dy).
constexpr int64_t kUids[3] = {1, 2, 3};

bool execute_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t plan, void* const ptrs[3], void* workspace) {
  BackendDesc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  return pack && set(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, kUids) &&
         set(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptrs) &&
         set(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace) &&
         GRAPH_OK(cudnnBackendFinalize(pack.get())) &&
         GRAPH_OK(cudnnBackendExecute(handle, plan, pack.get()));
}

// ---- plans

// How one convolution runs, built once per key.
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

using Key = std::array<int64_t, 21>;
std::mutex g_plans_mutex;
// Never shrinks, and is never destroyed (cuDNN may be gone at exit); Plan addresses stay valid.
std::map<Key, std::unique_ptr<Plan>>& g_plans = *new std::map<Key, std::unique_ptr<Plan>>();

Key make_key(ConvOp op, DType dtype, bool nhwc, const Shape& xs, const Shape& ws, const Conv2dParams& p,
             int64_t alignment) {
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
          alignment,
          cuda_deterministic() ? 1 : 0};
}

Tensor workspace(size_t bytes) {
  return Tensor::empty({static_cast<int64_t>(bytes)}, DType::u8, cuda::current_device());
}

// The largest workspace a candidate may ask for (see the top of the file).
size_t workspace_limit(DType dtype, const Shape& xs, const Shape& ws, const Shape& ys) {
  const size_t largest =
      static_cast<size_t>(std::max({shape_numel(xs), shape_numel(ws), shape_numel(ys)})) * dtype_size(dtype);
  return std::max(kMinWorkspaceLimit, 4 * largest);
}

// Largest power of two up to 16 that divides every address: engines that load vectors need it.
int64_t alignment_of(void* const ptrs[3]) {
  int64_t a = 16;
  for (int i = 0; i < 3; ++i)
    while (a > 1 && reinterpret_cast<uintptr_t>(ptrs[i]) % static_cast<uintptr_t>(a) != 0) a /= 2;
  return a;
}

// The candidate to keep: the smallest workspace among those within kWorkspaceSlack of the fastest.
struct Timed {
  float ms;
  size_t workspace;
  int index;
};
int choose_timed(const std::vector<Timed>& t) {
  if (t.empty()) return -1;
  float best = std::numeric_limits<float>::infinity();
  for (const Timed& c : t) best = std::min(best, c.ms);
  int pick = -1;
  for (size_t i = 0; i < t.size(); ++i)
    if (t[i].ms <= best * kWorkspaceSlack && (pick < 0 || t[i].workspace < t[pick].workspace))
      pick = static_cast<int>(i);
  return t[pick].index;
}

// A one-operation graph with the descriptors it was built from (kept alive with it, as cuDNN's
// frontend does).
struct Graph {
  std::vector<BackendDesc> parts;  // tensors, convolution, operation
  BackendDesc graph;
  explicit operator bool() const { return static_cast<bool>(graph); }
  // Gives up ownership of every descriptor (a cached plan keeps them for the process's life).
  void release() {
    for (BackendDesc& d : parts) d.release();
    graph.release();
  }
};

// The convolution of op as a one-operation graph, or an empty Graph when cuDNN refuses it.
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

// Whether the engine of cfg keeps the numerics this dtype asks for.
bool numerics_allowed(cudnnBackendDescriptor_t cfg, DType dtype) {
  const EngineInfo info = engine_info(cfg);
  if (!info.known || info.reduced_precision) return false;
  const bool strict_fp32 = dtype == DType::f32 && !cuda_allow_tf32();
  if (info.tensor_core && (strict_fp32 || dtype == DType::f64)) return false;
  if (info.nondeterministic && cuda_deterministic()) return false;
  // Compiling kernels at run time costs seconds per shape at start-up.
  return !info.runtime_compiled || cudnn_switches().runtime_compiled_engines;
}

// Milliseconds per call of run() on the GPU (best of a few rounds), or infinity when a call fails.
// A lone call on an idle GPU also times the host's launch (cuDNN's execute is ~10 us of host work,
// and a split-K engine launches its workspace zeroing and its kernel separately), which a graph replay
// or a busy stream does not pay. So a short call is queued back to back, enough calls to cover about
// kQueuedWindowMs, and the mean taken. TRAINER_CUDNN_TIMING=single times one call per round, as
// sessions up to 8 did.
constexpr float kQueuedWindowMs = 0.3f;
constexpr int kMaxQueued = 8;
template <class Run>
float time_calls(Run&& run) {
  const float fail = std::numeric_limits<float>::infinity();
  if (!run()) return fail;  // warm-up
  const bool single = cudnn_switches().single_call_timing;
  cudaStream_t stream = cuda_stream();
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  float best = fail;
  int calls = 1;
  for (int round = 0; round < 3; ++round) {
    CUDA_CHECK(cudaEventRecord(a, stream));
    bool good = true;
    for (int i = 0; i < calls && good; ++i) good = run();
    CUDA_CHECK(cudaEventRecord(b, stream));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = fail;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    if (!good) {
      best = fail;
      break;
    }
    best = std::min(best, ms / static_cast<float>(calls));
    // The first round (one call) says how many calls fill the window.
    if (round == 0 && !single)
      calls = std::clamp(static_cast<int>(kQueuedWindowMs / std::max(best, 1e-3f)), 1, kMaxQueued);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return best;
}

float time_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t plan, void* const ptrs[3], void* ws) {
  return time_calls([&] { return execute_plan(handle, plan, ptrs, ws); });
}

// The fastest graph-API plan for the convolution, or nullptr when none runs.
cudnnBackendDescriptor_t graph_plan(ConvOp op, DType dtype, bool nhwc, const Shape& xs, const Shape& ws,
                                    const Shape& ys, const Conv2dParams& p, void* const ptrs[3],
                                    int64_t alignment, size_t& workspace_bytes, float& time_ms) {
  const size_t limit = workspace_limit(dtype, xs, ws, ys);
  cudnnHandle_t handle = cuda_context().cudnn;
  Graph graph = operation_graph(handle, op, dtype, nhwc, xs, ws, ys, p, alignment);
  if (!graph) return nullptr;
  struct Candidate {
    BackendDesc plan, cfg;
    size_t workspace;
  };
  std::vector<Candidate> candidates;
  auto consider = [&](BackendDesc cfg) {
    if (candidates.size() >= kMaxCandidates) return;
    if (!numerics_allowed(cfg.get(), dtype)) return;
    BackendDesc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    cudnnBackendDescriptor_t c = cfg.get();
    if (!plan || !set(plan.get(), kPlanHandle, CUDNN_TYPE_HANDLE, 1, &handle) ||
        !set(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c) ||
        cudnnBackendFinalize(plan.get()) != CUDNN_STATUS_SUCCESS)
      return;
    int64_t bytes = 0, n = 0;
    if (!GRAPH_OK(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                           CUDNN_TYPE_INT64, 1, &n, &bytes)) ||
        bytes < 0 || static_cast<size_t>(bytes) > limit)
      return;
    candidates.push_back({std::move(plan), std::move(cfg), static_cast<size_t>(bytes)});
  };
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    for (BackendDesc& cfg : engine_configs(graph.graph.get(), mode)) consider(std::move(cfg));
    if (!candidates.empty()) break;  // the fallback list only when the heuristics gave nothing usable
  }
  if (candidates.empty()) return nullptr;
  // Deterministic mode runs the first candidate that works (below), so it allocates only what that
  // one needs, and a failed allocation is an error: falling back to other engines would make the
  // choice depend on the free memory of the moment.
  const bool deterministic = cuda_deterministic();
  size_t max_ws = 0;
  for (const Candidate& c : candidates) max_ws = std::max(max_ws, c.workspace);
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
    const float ms =
        time_plan(handle, candidates[i].plan.get(), ptrs, max_ws ? ws_tensor.raw_data() : nullptr);
    if (debug())
      std::fprintf(stderr, "cudnn graph:   %s ws %zu: %.4f ms\n",
                   config_signature(candidates[i].cfg.get()).c_str(), candidates[i].workspace, ms);
    if (ms < std::numeric_limits<float>::infinity())
      timed.push_back({ms, candidates[i].workspace, static_cast<int>(i)});
  }
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

// Runs the legacy algorithm of plan on ptrs = {x or dx, w or dw, y or dy} with workspace wp.
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

struct PlanCounts {
  int graph = 0, legacy = 0, none = 0;
  size_t max_workspace = 0;
};
PlanCounts g_counts;

// The cached plan for the convolution, built (and timed on these buffers) on first use.
const Plan& plan_for(ConvOp op, DType dtype, bool nhwc, const Shape& xs, const Shape& wsh, const Shape& ys,
                     const Conv2dParams& p, void* const ptrs[3]) {
  const int64_t alignment = alignment_of(ptrs);
  const Key key = make_key(op, dtype, nhwc, xs, wsh, p, alignment);
  {
    std::lock_guard<std::mutex> lock(g_plans_mutex);
    auto it = g_plans.find(key);
    if (it != g_plans.end()) return *it->second;
  }
  const bool legacy_only = cudnn_switches().api == CudnnSwitches::Api::legacy;
  const bool graph_only = cudnn_switches().api == CudnnSwitches::Api::graph;
  const float never = std::numeric_limits<float>::infinity();
  std::unique_ptr<Plan> graph;
  float graph_ms = never, legacy_ms = never;
  if (!legacy_only) {
    size_t bytes = 0;
    if (cudnnBackendDescriptor_t g =
            graph_plan(op, dtype, nhwc, xs, wsh, ys, p, ptrs, alignment, bytes, graph_ms)) {
      graph = std::make_unique<Plan>();
      graph->graph = g;
      graph->workspace = bytes;
    }
  }
  std::unique_ptr<Plan> plan;
  // Deterministic mode compares no timings: the graph plan when there is one, else the legacy one.
  const bool compare = !graph_only && !cuda_deterministic();
  if (compare || !graph) plan = legacy_plan(op, dtype, nhwc, xs, wsh, ys, p, ptrs, legacy_ms);
  if (graph && plan && !plan->none && !cudnn_switches().single_call_timing) {
    // Find timed its algorithms one call at a time; the graph candidates were timed queued. Time the
    // legacy pick the same way, so that the comparison below is like for like.
    Tensor ws = plan->workspace ? workspace(plan->workspace) : Tensor();
    void* wp = plan->workspace ? ws.raw_data() : nullptr;
    legacy_ms = time_calls([&] {
      execute_legacy(*plan, op, dtype, ptrs, wp);
      return true;
    });
  }
  if (graph) {
    // The graph plan unless the legacy algorithm is faster, or as fast with a smaller workspace.
    const bool legacy_wins =
        plan && !plan->none &&
        (legacy_ms * kWorkspaceSlack < graph_ms ||
         (legacy_ms <= graph_ms * kWorkspaceSlack && plan->workspace < graph->workspace));
    if (!legacy_wins) plan = std::move(graph);
  }
  if (debug())
    std::fprintf(stderr, "cudnn: %s x%s w%s %s: %s (graph %.4f ms, legacy %.4f ms)\n", op_name(op),
                 shape_str(xs).c_str(), shape_str(wsh).c_str(), nhwc ? "nhwc" : "nchw",
                 plan->none    ? "none"
                 : plan->graph ? "graph"
                               : "legacy",
                 graph_ms, legacy_ms);
  std::lock_guard<std::mutex> lock(g_plans_mutex);
  (plan->none ? g_counts.none : plan->graph ? g_counts.graph : g_counts.legacy) += 1;
  g_counts.max_workspace = std::max(g_counts.max_workspace, plan->workspace);
  auto [it, inserted] = g_plans.emplace(key, std::move(plan));
  return *it->second;
}

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
    void* const cp[3] = {ptrs[0], ptrs[1], ptrs[2]};
    BackendDesc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    if (!pack) CUDNN_CHECK(CUDNN_STATUS_ALLOC_FAILED);
    CUDNN_CHECK(
        cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, kUids));
    CUDNN_CHECK(cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                         CUDNN_TYPE_VOID_PTR, 3, cp));
    CUDNN_CHECK(
        cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &wp));
    CUDNN_CHECK(cudnnBackendFinalize(pack.get()));
    CUDNN_CHECK(cudnnBackendExecute(ctx.cudnn, plan.graph, pack.get()));
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

}  // namespace

std::string cuda_conv_summary() {
  std::lock_guard<std::mutex> lock(g_plans_mutex);
  return "conv plans: " + std::to_string(g_counts.graph) + " graph API, " + std::to_string(g_counts.legacy) +
         " legacy, " + std::to_string(g_counts.none) + " none; largest workspace " +
         std::to_string(g_counts.max_workspace >> 20) + " MiB";
}

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
  const auto plain = [&] {
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
  // train.cudnn_fusion: a convolution feeding a training BatchNorm may also sum its output per channel.
  if (std::optional<Tensor> fused = conv2d_with_channel_sums(x_in, w_in, bias.defined(), p, ys, plain))
    return *fused;
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
    void* const ptrs[3] = {x.raw_data(), dw.raw_data(), dy.raw_data()};
    run_conv(ConvOp::backward_filter, dtype, cl, x.shape(), w_shape, ys, p, ptrs);
    return dw;
  });
}

}  // namespace trainer
