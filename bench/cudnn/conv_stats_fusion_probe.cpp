#include "bench/cudnn/conv_stats_fusion_probe.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>

#include "nn/cuda/conv_geometry.h"
#include "nn/cuda/conv_stats_graph.h"
#include "nn/cuda/cuda_common.h"
#include "nn/random.h"

namespace trainer::bench {

using namespace cuda;
using namespace cuda::conv_stats;

ConvProbeRow probe_engines(const OpGraph& g, const char* name, const std::vector<int64_t>& uids,
                           const std::map<int64_t, void*>& buffers, std::optional<RunnablePlan>& best) {
  ConvProbeRow row;
  row.pattern = name;
  if (!g.graph) {
    row.note = "cuDNN refused the operation graph (TRAINER_CUDNN_DEBUG=1 names the call)";
    return row;
  }
  std::vector<void*> ptrs;
  for (int64_t uid : uids) ptrs.push_back(buffers.at(uid));
  int rtc = 0;
  double finalize_s = 0.0;
  std::set<int64_t> seen;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    for (cudnn_graph::BackendDesc& cfg : cudnn_graph::engine_configs(g.graph.get(), mode)) {
      const cudnn_graph::EngineInfo info = cudnn_graph::engine_info(cfg.get());
      if (!seen.insert(info.index).second) continue;
      ++row.engines;
      // Finalising a plan is where a runtime-fusion engine compiles its kernel: a training run would
      // pay this at start-up for every shape and every engine it times.
      const auto finalize_start = std::chrono::steady_clock::now();
      std::optional<Plan> plan = finalize_plan(cfg.get(), int64_t{1} << 30);
      finalize_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - finalize_start).count();
      if (!plan) continue;
      Tensor workspace =
          Tensor::empty({std::max<int64_t>(plan->workspace_bytes, 1)}, DType::u8, current_device());
      RunnablePlan r{std::move(*plan), uids, ptrs, std::move(workspace)};
      const float ms = time_per_call_ms([&] { return r.execute(); });
      cudaGetLastError();
      if (!(ms < std::numeric_limits<float>::infinity())) continue;
      ++row.runnable;
      rtc += info.runtime_compiled;
      if (row.best_ms < 0 || ms < row.best_ms) {
        row.best_ms = ms;
        row.best_engine = info.index;
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

ConvProbeRow timed_row(const char* name, const std::function<bool()>& run) {
  ConvProbeRow row;
  row.pattern = name;
  row.best_ms = time_per_call_ms(run);
  row.engines = row.runnable = 1;
  return row;
}

namespace {

// Every engine the heuristics offer for `pattern` (each engine once, though both heuristics modes may
// list it), finalised and timed on these buffers. `best` receives the fastest.
ConvProbeRow probe(Pattern pattern, const char* name, DType dtype, const Shape& xs, const Shape& ws,
                   const Shape& ys, const Conv2dParams& p, const std::map<int64_t, void*>& buffers,
                   std::optional<RunnablePlan>& best) {
  return probe_engines(build(pattern, cuda_context().cudnn, dtype, xs, ws, ys, p), name, pack_uids(pattern),
                       buffers, best);
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

std::vector<ConvProbeRow> probe_conv_stats_fusion(DType dtype, const Shape& xs, const Shape& ws,
                                                  const Conv2dParams& p) {
  if (dtype != DType::bf16 && dtype != DType::f16)
    throw std::invalid_argument("probe_conv_stats_fusion: bf16 or f16, got " +
                                std::string(dtype_name(dtype)));
  const Device dev = current_device();
  const Shape ys = cudnn_conv::check_geometry("probe_conv_stats_fusion", xs, ws, p);
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
  std::vector<ConvProbeRow> rows;
  std::optional<RunnablePlan> conv;
  rows.push_back(probe(Pattern::conv, "conv alone", dtype, xs, ws, ys, p, buffers, conv));
  Backend& k = backend_for(y);
  rows.push_back(timed_row("our statistics kernel alone (bn_mean_var)", [&] {
    k.bn_mean_var(y);
    return true;
  }));
  if (conv)  // what a training step runs today: the two back to back
    rows.push_back(timed_row("ours: conv, then bn_mean_var", [&] {
      if (!conv->execute()) return false;
      k.bn_mean_var(y);
      return true;
    }));
  const int64_t count = ys[0] * ys[2] * ys[3];
  for (auto [pattern, name] :
       {std::pair{Pattern::genstats, "conv + genstats (fused)"},
        std::pair{Pattern::reduction, "conv + sum/sum-of-squares reductions (fused)"}}) {
    std::optional<RunnablePlan> fused;
    ConvProbeRow row = probe(pattern, name, dtype, xs, ws, ys, p, buffers, fused);
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

}  // namespace trainer::bench
