#include "bench/cudnn/knob_search_probe.h"

#include <algorithm>
#include <set>
#include <string>

#include "bench/cudnn/cudnn_knobs.h"
#include "nn/cuda/conv_geometry.h"
#include "nn/cuda/conv_graph_api.h"
#include "nn/cuda/cuda_common.h"
#include "nn/random.h"

namespace trainer::bench {
namespace {

using namespace cudnn_conv;
using namespace cudnn_graph;

// The wide search: up to this many configurations, including the knob neighbours of the first
// kNeighbourBases, with up to kValuesPerKnob values per knob.
constexpr size_t kMaxWideCandidates = 160;
constexpr size_t kNeighbourBases = 4;
constexpr int kValuesPerKnob = 12;

// The wide search's candidates for graph, in the order they are met; `keep` receives what the knob
// neighbours' configurations were built from, which must outlive them.
std::vector<GraphCandidate> wide_candidates(cudnnHandle_t handle, cudnnBackendDescriptor_t graph, DType dtype,
                                            size_t limit, std::vector<std::vector<BackendDesc>>& keep) {
  std::vector<GraphCandidate> candidates;
  std::set<std::string> seen;  // the same configuration turns up in several lists
  auto consider = [&](BackendDesc cfg, std::vector<BackendDesc> parts) {
    if (candidates.size() >= kMaxWideCandidates) return;
    if (!numerics_allowed(cfg.get(), dtype)) return;
    if (!seen.insert(config_signature(cfg.get())).second) return;
    if (std::optional<GraphCandidate> c = graph_candidate(handle, std::move(cfg), dtype, limit)) {
      candidates.push_back(std::move(*c));
      keep.push_back(std::move(parts));
    }
  };
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    for (BackendDesc& cfg : engine_configs(graph, mode)) consider(std::move(cfg), {});
    if (!candidates.empty()) break;  // the fallback list only when the heuristics gave nothing usable
  }
  if (candidates.empty()) return candidates;
  for (BackendDesc& cfg : engine_configs(graph, CUDNN_HEUR_MODE_B)) consider(std::move(cfg), {});
  // By index: consider() grows the vector.
  const size_t bases = std::min(candidates.size(), kNeighbourBases);
  for (size_t i = 0; i < bases; ++i)
    for (OwnedConfig& n : knob_neighbours(graph, candidates[i].cfg.get(), kValuesPerKnob))
      consider(std::move(n.cfg), std::move(n.parts));
  return candidates;
}

// One search's row: the candidates timed on ptrs and the one training's rule keeps.
ConvProbeRow search_row(const std::string& name, cudnnHandle_t handle,
                        const std::vector<GraphCandidate>& candidates, void* const ptrs[3]) {
  ConvProbeRow row;
  row.pattern = name;
  row.engines = static_cast<int>(candidates.size());
  const std::vector<Timed> timed = time_candidates(handle, candidates, ptrs);
  row.runnable = static_cast<int>(timed.size());
  const int pick = choose_timed(timed);
  if (pick < 0) {
    row.note = "nothing ran";
    return row;
  }
  for (const Timed& t : timed)
    if (t.index == pick) row.best_ms = t.ms;
  row.best_engine = engine_info(candidates[pick].cfg.get()).index;
  row.note = config_signature(candidates[pick].cfg.get()) + ", workspace " +
             std::to_string(candidates[pick].workspace >> 20) + " MiB";
  return row;
}

}  // namespace

std::vector<ConvProbeRow> probe_knob_search(DType dtype, const Shape& xs, const Shape& ws,
                                            const Conv2dParams& p) {
  const Shape ys = check_geometry("probe_knob_search", xs, ws, p);
  const Device dev = cuda::current_device();
  const MemoryFormat cl = MemoryFormat::channels_last;
  Generator gen(1);
  // x (or dx), w (or dw), y (or dy): the backwards overwrite x and w, which only the timing reads.
  Tensor x = Tensor::empty(xs, dtype, dev, cl), w = Tensor::empty(ws, dtype, dev, cl),
         y = Tensor::empty(ys, dtype, dev, cl);
  normal_(x, 0.0, 1.0, gen);
  normal_(w, 0.0, 0.05, gen);
  normal_(y, 0.0, 1.0, gen);
  void* const ptrs[3] = {x.raw_data(), w.raw_data(), y.raw_data()};
  cudnnHandle_t handle = cuda_context().cudnn;
  const size_t limit = workspace_limit(dtype, xs, ws, ys);
  std::vector<ConvProbeRow> rows;
  for (ConvOp op : {ConvOp::forward, ConvOp::backward_data, ConvOp::backward_filter}) {
    const std::string name = op_name(op);
    // Alignment 16: the caching allocator's blocks are at least that aligned.
    const Graph graph = operation_graph(handle, op, dtype, /*nhwc=*/true, xs, ws, ys, p, /*alignment=*/16);
    if (!graph) {
      ConvProbeRow row;
      row.pattern = name;
      row.note = "cuDNN refused the operation graph (TRAINER_CUDNN_DEBUG=1 names the call)";
      rows.push_back(row);
      continue;
    }
    rows.push_back(search_row(name + ": the trainer's search", handle,
                              heuristic_candidates(handle, graph.graph.get(), dtype, limit), ptrs));
    std::vector<std::vector<BackendDesc>> keep;
    rows.push_back(search_row(name + ": wide search", handle,
                              wide_candidates(handle, graph.graph.get(), dtype, limit, keep), ptrs));
  }
  return rows;
}

}  // namespace trainer::bench
