#include "nn/cuda/fused_attention_plans.h"

#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "nn/cuda/cuda_backend.h"
#include "nn/cuda/cuda_common.h"

namespace trainer::cuda::attention {
namespace {

using conv_stats::OpGraph;
using conv_stats::Plan;

constexpr int64_t kMaxHeadDim = 128;
constexpr int64_t kRowAlignment = 8;  // elements: 16 bytes of bf16/f16

std::mutex g_mutex;
// Never shrinks and is never destroyed (cuDNN may be gone at exit): plans live as long as the process.
std::map<std::vector<int64_t>, std::unique_ptr<Plans>>& g_plans =
    *new std::map<std::vector<int64_t>, std::unique_ptr<Plans>>();

bool aligned16(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.raw_data()) % 16 == 0; }

Dims dims_of(const Tensor& t) { return {t.size(0), t.size(1), t.size(2), t.size(3)}; }
Dims strides_of(const Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2), t.stride(3)}; }

// The strides of a [B, H, R, C] view of [B, R, H, C] memory: the layout of the output and of the
// gradients of unpacked inputs.
Dims heads_inner_strides(const Dims& d) { return {d[2] * d[1] * d[3], d[3], d[1] * d[3], 1}; }

bool readable(const Tensor& t) {
  if (t.dim() != 4 || t.stride(3) != 1 || !aligned16(t) || t.device() != current_device()) return false;
  for (int i = 0; i < 3; ++i)
    if (t.stride(i) % kRowAlignment != 0) return false;
  return true;
}

// Whether q, k and v are packed_attention_head(qkv, 0..2) of one dense qkv [B, T, 3, H, d].
bool packed_views(const Tensor& q, const Tensor& k, const Tensor& v) {
  const int64_t t = q.size(2), h = q.size(1), d = q.size(3);
  const Dims packed{t * 3 * h * d, d, 3 * h * d, 1};
  return q.same_storage(k) && q.same_storage(v) && q.shape() == k.shape() && q.shape() == v.shape() &&
         strides_of(q) == packed && strides_of(k) == packed && strides_of(v) == packed &&
         k.offset() == q.offset() + h * d && v.offset() == q.offset() + 2 * h * d;
}

std::vector<int64_t> key_of(const Problem& p) {
  std::vector<int64_t> key{static_cast<int64_t>(p.dtype), p.b, p.h, p.t, p.s, p.d, p.dv, p.packed};
  for (const Dims* s :
       {&p.q_strides, &p.k_strides, &p.v_strides, &p.o_strides, &p.dq_strides, &p.dk_strides, &p.dv_strides})
    key.insert(key.end(), s->begin(), s->end());
  return key;
}

std::string describe(const Problem& p) {
  return std::string(dtype_name(p.dtype)) + " q " + shape_str({p.b, p.h, p.t, p.d}) + ", k/v length " +
         std::to_string(p.s);
}

// Said once per process; every case under TRAINER_CUDNN_DEBUG=1.
void warn(const std::string& what) {
  static std::once_flag once;
  std::call_once(once, [&] {
    std::fprintf(
        stderr,
        "trainer: warning: cuDNN fused attention unavailable (%s); attention runs composed of bmm and "
        "softmax where it does not apply. HINT: TRAINER_CUDNN_DEBUG=1 names each cuDNN call that "
        "failed\n",
        what.c_str());
  });
  if (cudnn_graph::debug()) std::fprintf(stderr, "cudnn attention: %s\n", what.c_str());
}

// Why this process cannot fuse attention at all (cuDNN or GPU too old), or "" when it can.
const std::string& unsupported_here() {
  static const std::string why = [] {
    int major = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, cuda_context().device);
    const size_t version = cudnnGetVersion();
    if (major < 8) return "compute capability " + std::to_string(major) + ".x, it needs 8.0+";
    if (version < 90000) return "cuDNN " + std::to_string(version) + ", it needs 9.0+";
    return std::string();
  }();
  return why;
}

// The configuration cuDNN's heuristics rank first among those that finalise, its plan into `plan`.
cudnn_graph::BackendDesc first_plan(const OpGraph& g, std::optional<Plan>& plan, int64_t max_workspace) {
  for (cudnnBackendHeurMode_t heur : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK})
    for (cudnn_graph::BackendDesc& cfg : cudnn_graph::engine_configs(g.graph.get(), heur))
      if ((plan = conv_stats::finalize_plan(cfg.get(), max_workspace))) return std::move(cfg);
  return cudnn_graph::BackendDesc();
}

// Known faults of cuDNN versions in the backward, as cudnn-frontend lists them: 9.10.0/9.10.1 (wrong
// results), and up to 9.15 a key length not a multiple of 128 without a padding mask (which cudnn-frontend
// then adds and these graphs do not have).
std::string version_refusal(const Problem& p) {
  const size_t v = cudnnGetVersion();
  if (v == 91000 || v == 91001) return "cuDNN 9.10.0/9.10.1 compute the backward wrongly";
  if (v <= 91500 && p.s % 128 != 0) return "cuDNN up to 9.15 needs k/v lengths that are multiples of 128";
  return "";
}

std::unique_ptr<Plans> build_plans(const Problem& p) {
  auto plans = std::make_unique<Plans>();
  std::string why = unsupported_here().empty() ? version_refusal(p) : unsupported_here();
  if (why.empty()) {
    const cudnnHandle_t handle = cuda_context().cudnn;
    // The backward's engines ask for little beyond the dQ accumulator it gets apart: 256 MiB is ample.
    const int64_t max_workspace = int64_t{256} << 20;
    plans->forward_graph = build_forward(handle, p);
    plans->backward_graph = build_backward(handle, p);
    if (plans->forward_graph.graph && plans->backward_graph.graph) {
      plans->forward_config = first_plan(plans->forward_graph, plans->forward, max_workspace);
      plans->backward_config = first_plan(plans->backward_graph, plans->backward, max_workspace);
    }
    if (!plans->forward || !plans->backward) why = "cuDNN has no engine for " + describe(p);
  }
  cudaGetLastError();  // a refused engine may leave an error behind
  plans->usable = why.empty();
  if (!why.empty()) warn(why);
  return plans;
}

}  // namespace

std::optional<Problem> problem_for(const Tensor& q, const Tensor& k, const Tensor& v) {
  const DType dt = q.dtype();
  if ((dt != DType::bf16 && dt != DType::f16) || k.dtype() != dt || v.dtype() != dt || !readable(q) ||
      !readable(k) || !readable(v))
    return std::nullopt;
  Problem p;
  p.dtype = dt;
  p.b = q.size(0), p.h = q.size(1), p.t = q.size(2), p.s = k.size(2), p.d = q.size(3), p.dv = v.size(3);
  const bool shapes_ok = dims_of(k) == Dims{p.b, p.h, p.s, p.d} && dims_of(v) == Dims{p.b, p.h, p.s, p.dv} &&
                         p.b * p.h * p.t * p.s > 0 && !(p.t == 1 && p.s == 1);
  const bool heads_ok = p.d % 8 == 0 && p.dv % 8 == 0 && p.d <= kMaxHeadDim && p.dv <= kMaxHeadDim;
  if (!shapes_ok || !heads_ok) return std::nullopt;
  p.q_strides = strides_of(q), p.k_strides = strides_of(k), p.v_strides = strides_of(v);
  p.o_strides = heads_inner_strides({p.b, p.h, p.t, p.dv});
  p.packed = packed_views(q, k, v);
  p.dq_strides = p.packed ? p.q_strides : heads_inner_strides(dims_of(q));
  p.dk_strides = p.packed ? p.k_strides : heads_inner_strides(dims_of(k));
  p.dv_strides = p.packed ? p.v_strides : heads_inner_strides(dims_of(v));
  return p;
}

Tensor heads_inner_empty(const Dims& d, DType dtype) {
  return empty({d[0], d[2], d[1], d[3]}, dtype).permute({0, 2, 1, 3});
}

Plans* plans_for(const Problem& p, bool may_build) {
  const std::vector<int64_t> key = key_of(p);
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_plans.find(key);
    if (it != g_plans.end()) return it->second->usable ? it->second.get() : nullptr;
  }
  if (!may_build || cuda_stream_capturing()) return nullptr;
  std::unique_ptr<Plans> built = build_plans(p);
  std::lock_guard<std::mutex> lock(g_mutex);
  Plans* plans = g_plans.emplace(key, std::move(built)).first->second.get();
  return plans->usable ? plans : nullptr;
}

bool run(Plans& plans, const Plan& plan, const Problem& p, const std::vector<int64_t>& uids,
         const std::vector<void*>& ptrs, void* workspace, const char* what) {
  cuda_stream();  // the context's device, current on this thread
  if (plan.execute(uids, ptrs, workspace)) return true;
  cudaGetLastError();
  plans.usable = false;
  warn(std::string("the ") + what + " of " + describe(p) + " failed to run");
  return false;
}

}  // namespace trainer::cuda::attention
