#include "bench/cudnn/cudnn_knobs.h"

#include <algorithm>

namespace trainer::bench {

using namespace cudnn_graph;

namespace {

struct KnobRange {
  int64_t type, min, max, stride;
};

std::vector<KnobRange> knob_ranges(cudnnBackendDescriptor_t engine) {
  std::vector<KnobRange> out;
  for (const BackendDesc& info :
       read_descriptors(engine, CUDNN_ATTR_ENGINE_KNOB_INFO, CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR, kMaxKnobs)) {
    KnobRange r{read_knob_type(info.get(), CUDNN_ATTR_KNOB_INFO_TYPE),
                read_int(info.get(), CUDNN_ATTR_KNOB_INFO_MINIMUM_VALUE, 0),
                read_int(info.get(), CUDNN_ATTR_KNOB_INFO_MAXIMUM_VALUE, 0),
                read_int(info.get(), CUDNN_ATTR_KNOB_INFO_STRIDE, 1)};
    if (r.type >= 0 && r.max > r.min && r.stride > 0) out.push_back(r);
  }
  return out;
}

// At most `limit` values of the range, evenly spread, both ends included (in 128 bits: a knob's range
// may span most of int64).
std::vector<int64_t> spread(const KnobRange& r, int limit) {
  const __int128 steps = (static_cast<__int128>(r.max) - r.min) / r.stride;  // values: min + i * stride
  std::vector<int64_t> values;
  if (steps + 1 <= limit) {
    for (__int128 i = 0; i <= steps; ++i) values.push_back(static_cast<int64_t>(r.min + i * r.stride));
    return values;
  }
  for (int i = 0; i < limit; ++i) {
    const auto v = static_cast<int64_t>(r.min + (steps * i / (limit - 1)) * r.stride);
    if (values.empty() || values.back() != v) values.push_back(v);
  }
  return values;
}

// A finalised configuration of `engine` with these knob choices, or an empty one when cuDNN refuses it.
OwnedConfig make_config(BackendDesc engine, const std::vector<std::pair<int64_t, int64_t>>& choices) {
  OwnedConfig out;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (const auto& [type, value] : choices) {
    BackendDesc c(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR);
    const auto knob = static_cast<cudnnBackendKnobType_t>(type);
    if (!c || !set(c.get(), CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &knob) ||
        !set(c.get(), CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &value) ||
        !GRAPH_OK(cudnnBackendFinalize(c.get())))
      return {};
    raw.push_back(c.get());
    out.parts.push_back(std::move(c));
  }
  BackendDesc cfg(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
  cudnnBackendDescriptor_t e = engine.get();
  if (!cfg || !set(cfg.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &e) ||
      (!raw.empty() && !set(cfg.get(), CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                            static_cast<int64_t>(raw.size()), raw.data())) ||
      !GRAPH_OK(cudnnBackendFinalize(cfg.get())))
    return {};
  out.parts.push_back(std::move(engine));
  out.cfg = std::move(cfg);
  return out;
}

// A fresh finalised engine `index` of graph, or an empty descriptor.
BackendDesc make_engine(cudnnBackendDescriptor_t graph, int64_t index) {
  BackendDesc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  if (!engine ||
      !set(engine.get(), CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph) ||
      !set(engine.get(), CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &index) ||
      !GRAPH_OK(cudnnBackendFinalize(engine.get())))
    return BackendDesc();
  return engine;
}

}  // namespace

std::vector<OwnedConfig> knob_neighbours(cudnnBackendDescriptor_t graph, cudnnBackendDescriptor_t cfg,
                                         int per_knob) {
  std::vector<OwnedConfig> out;
  const int64_t index = engine_info(cfg).index;
  if (index < 0) return out;
  BackendDesc probe = make_engine(graph, index);
  if (!probe) return out;
  const std::vector<std::pair<int64_t, int64_t>> base = knob_choices(cfg);
  for (const KnobRange& r : knob_ranges(probe.get())) {
    const auto current =
        std::find_if(base.begin(), base.end(), [&](const auto& c) { return c.first == r.type; });
    const auto at = static_cast<size_t>(current - base.begin());  // base.size(): cfg did not choose it
    for (int64_t v : spread(r, per_knob)) {
      if (current != base.end() && current->second == v) continue;
      std::vector<std::pair<int64_t, int64_t>> choices = base;
      if (at < choices.size())
        choices[at].second = v;
      else
        choices.emplace_back(r.type, v);
      BackendDesc engine = make_engine(graph, index);
      if (!engine) continue;
      OwnedConfig c = make_config(std::move(engine), choices);
      if (c.cfg) out.push_back(std::move(c));
    }
  }
  return out;
}

}  // namespace trainer::bench
