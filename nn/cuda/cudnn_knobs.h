#pragma once
// The knobs of cuDNN graph-API engine configurations: reading the choices a configuration made and
// building its neighbours. cuDNN's heuristics return one configuration per engine, with knob values
// (tile shape, split-K, kernel variant) they predict to be best; a neighbour is the same engine with
// one knob set to another value its range allows. Timing the neighbours reaches kernels the
// heuristics did not rank (the wide convolution search in nn/cuda/conv.cpp).
#include <cudnn.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "nn/cuda/cudnn_graph.h"

namespace trainer::cudnn_graph {

// An engine configuration with the descriptors it was built from, which live as long as it does.
struct OwnedConfig {
  BackendDesc cfg;
  std::vector<BackendDesc> parts;  // the engine and the knob choices
};

// cfg's knob choices as (knob type, value) pairs, in cuDNN's order; empty when none or unreadable.
std::vector<std::pair<int64_t, int64_t>> knob_choices(cudnnBackendDescriptor_t cfg);

// "engine 12 [24=3 17=1]": the engine's global index and the knob choices, to tell configurations
// apart and to print them.
std::string config_signature(cudnnBackendDescriptor_t cfg);

// The finalised configurations that differ from cfg in one knob (its value from at most `per_knob`
// values spread evenly over the knob's range), on the engine of cfg for `graph`. Empty when the engine
// or its knobs cannot be read.
std::vector<OwnedConfig> knob_neighbours(cudnnBackendDescriptor_t graph, cudnnBackendDescriptor_t cfg,
                                         int per_knob);

}  // namespace trainer::cudnn_graph
