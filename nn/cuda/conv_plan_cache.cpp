#include "nn/cuda/conv_plan_cache.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "nn/cuda/conv_graph_api.h"
#include "nn/cuda/conv_legacy_api.h"
#include "nn/cuda/conv_timing.h"
#include "nn/cuda/cuda_backend.h"
#include "nn/cuda/cudnn_graph.h"
#include "nn/cuda/cudnn_switches.h"

namespace trainer::cudnn_conv {

using cudnn_graph::debug;

namespace {

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

// Largest power of two up to 16 that divides every address: engines that load vectors need it.
int64_t alignment_of(void* const ptrs[3]) {
  int64_t a = 16;
  for (int i = 0; i < 3; ++i)
    while (a > 1 && reinterpret_cast<uintptr_t>(ptrs[i]) % static_cast<uintptr_t>(a) != 0) a /= 2;
  return a;
}

struct PlanCounts {
  int graph = 0, legacy = 0, none = 0;
  size_t max_workspace = 0;
};
PlanCounts g_counts;

}  // namespace

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

}  // namespace trainer::cudnn_conv

namespace trainer {

std::string cuda_conv_summary() {
  std::lock_guard<std::mutex> lock(cudnn_conv::g_plans_mutex);
  return "conv plans: " + std::to_string(cudnn_conv::g_counts.graph) + " graph API, " +
         std::to_string(cudnn_conv::g_counts.legacy) + " legacy, " +
         std::to_string(cudnn_conv::g_counts.none) + " none; largest workspace " +
         std::to_string(cudnn_conv::g_counts.max_workspace >> 20) + " MiB";
}

}  // namespace trainer
