#include "nn/cuda/cudnn_graph.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "nn/cuda/cudnn_switches.h"

namespace trainer::cudnn_graph {

bool debug() { return cudnn_switches().debug; }

bool ok(cudnnStatus_t status, const char* what) {
  if (status == CUDNN_STATUS_SUCCESS) return true;
  if (debug()) std::fprintf(stderr, "cudnn graph: %s: %s\n", what, cudnnGetErrorString(status));
  return false;
}

std::array<int64_t, 4> dense_strides(const Shape& s, bool nhwc) {
  if (nhwc) return {s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]};
  return {s[1] * s[2] * s[3], s[2] * s[3], s[3], 1};
}

BackendDesc tensor_desc(int64_t uid, cudnnDataType_t dt, const Shape& shape, bool nhwc, int64_t alignment,
                        bool is_virtual) {
  return strided_tensor_desc(uid, dt, {shape[0], shape[1], shape[2], shape[3]}, dense_strides(shape, nhwc),
                             alignment, is_virtual ? Residence::is_virtual : Residence::memory);
}

BackendDesc strided_tensor_desc(int64_t uid, cudnnDataType_t dt, const std::array<int64_t, 4>& dims,
                                const std::array<int64_t, 4>& strides, int64_t alignment,
                                Residence residence) {
  BackendDesc t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  if (!t) return t;
  const bool yes = true;
  if (!set(t.get(), CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt) ||
      !set(t.get(), CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data()) ||
      !set(t.get(), CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data()) ||
      !set(t.get(), CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid) ||
      !set(t.get(), CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment) ||
      (residence == Residence::is_virtual &&
       !set(t.get(), CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes)) ||
      (residence == Residence::by_value &&
       !set(t.get(), CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes)) ||
      !GRAPH_OK(cudnnBackendFinalize(t.get())))
    return BackendDesc();
  return t;
}

BackendDesc convolution_desc(const Conv2dParams& p, cudnnDataType_t compute) {
  BackendDesc conv(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  if (!conv) return conv;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t spatial = 2;
  const int64_t dil[2] = {p.dilation_h, p.dilation_w}, str[2] = {p.stride_h, p.stride_w},
                pad[2] = {p.pad_h, p.pad_w};
  if (!set(conv.get(), CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute) ||
      !set(conv.get(), CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode) ||
      !set(conv.get(), CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial) ||
      !set(conv.get(), CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dil) ||
      !set(conv.get(), CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, str) ||
      !set(conv.get(), CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad) ||
      !set(conv.get(), CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad) ||
      !GRAPH_OK(cudnnBackendFinalize(conv.get())))
    return BackendDesc();
  return conv;
}

EngineInfo engine_info(cudnnBackendDescriptor_t cfg) {
  EngineInfo info;
  BackendDesc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  int64_t n = 0;
  if (!engine || !GRAPH_OK(cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE,
                                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, engine.addr())))
    return info;
  cudnnBackendDescriptor_t e = engine.get();
  cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &info.index);
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  int64_t count = 0;
  if (!GRAPH_OK(cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                         CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &count, notes)))
    return info;
  info.known = true;
  for (int64_t i = 0; i < count; ++i) {
    if (notes[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS ||
        notes[i] == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION)
      info.reduced_precision = true;
    if (notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE) info.tensor_core = true;
    if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) info.nondeterministic = true;
  }
  cudnnBackendBehaviorNote_t behaviour[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
  count = 0;
  if (cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                               CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &count, behaviour) == CUDNN_STATUS_SUCCESS)
    for (int64_t i = 0; i < count; ++i)
      if (behaviour[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) info.runtime_compiled = true;
  return info;
}

// The engine configurations the heuristics suggest for graph, best first.
std::vector<BackendDesc> engine_configs(cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode) {
  std::vector<BackendDesc> out;
  BackendDesc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  if (!heur ||
      !set(heur.get(), CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph) ||
      !set(heur.get(), CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode) ||
      !GRAPH_OK(cudnnBackendFinalize(heur.get())))
    return out;
  int64_t count = 0;
  if (!GRAPH_OK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr)) ||
      count <= 0)
    return out;
  return read_descriptors(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR,
                          count);
}

std::vector<BackendDesc> read_descriptors(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                                          cudnnBackendDescriptorType_t type, int64_t max_count) {
  std::vector<BackendDesc> owned;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < max_count; ++i) {
    owned.emplace_back(type);
    if (!owned.back()) return {};
    raw.push_back(owned.back().get());
  }
  int64_t count = 0;
  if (!GRAPH_OK(
          cudnnBackendGetAttribute(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, max_count, &count, raw.data())))
    return {};
  owned.resize(static_cast<size_t>(std::clamp<int64_t>(count, 0, max_count)));
  return owned;
}

int64_t read_int(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, int64_t fallback) {
  int64_t value = fallback, n = 0;
  if (!GRAPH_OK(cudnnBackendGetAttribute(d, name, CUDNN_TYPE_INT64, 1, &n, &value)) || n != 1)
    return fallback;
  return value;
}

int64_t read_knob_type(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name) {
  cudnnBackendKnobType_t type = CUDNN_KNOB_TYPE_COUNTS;
  int64_t n = 0;
  if (!GRAPH_OK(cudnnBackendGetAttribute(d, name, CUDNN_TYPE_KNOB_TYPE, 1, &n, &type)) || n != 1) return -1;
  return static_cast<int64_t>(type);
}

std::vector<std::pair<int64_t, int64_t>> knob_choices(cudnnBackendDescriptor_t cfg) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const BackendDesc& c : read_descriptors(cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES,
                                               CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, kMaxKnobs)) {
    const int64_t type = read_knob_type(c.get(), CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE);
    if (type < 0) return {};
    out.emplace_back(type, read_int(c.get(), CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, 0));
  }
  return out;
}

std::string config_signature(cudnnBackendDescriptor_t cfg) {
  std::string s = "engine " + std::to_string(engine_info(cfg).index) + " [";
  for (const auto& [type, value] : knob_choices(cfg)) {
    if (s.back() != '[') s += ' ';
    s += std::to_string(type);
    s += '=';
    s += std::to_string(value);
  }
  s += ']';
  return s;
}

}  // namespace trainer::cudnn_graph
