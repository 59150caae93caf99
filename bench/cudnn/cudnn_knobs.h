#pragma once
// The knob neighbours of a cuDNN graph-API engine configuration. cuDNN's heuristics return one
// configuration per engine, with the knob values (tile shape, split-K, kernel variant) they predict to
// be best; a neighbour is the same engine with one knob set to another value its range allows. Timing
// the neighbours reaches kernels the heuristics did not rank: the wide search of
// bench/cudnn_knob_probe, which asks whether the trainer's search (the heuristics' first
// configurations, nn/cuda/conv_graph_api.h) misses a faster kernel on a GPU or cuDNN version.
#include <cudnn.h>

#include <vector>

#include "nn/cuda/cudnn_graph.h"

namespace trainer::bench {

// An engine configuration with the descriptors it was built from, which live as long as it does.
struct OwnedConfig {
  cudnn_graph::BackendDesc cfg;
  std::vector<cudnn_graph::BackendDesc> parts;  // the engine and the knob choices
};

// The finalised configurations that differ from cfg in one knob (its value from at most `per_knob`
// values spread evenly over the knob's range), on the engine of cfg for `graph`. Empty when the engine
// or its knobs cannot be read.
std::vector<OwnedConfig> knob_neighbours(cudnnBackendDescriptor_t graph, cudnnBackendDescriptor_t cfg,
                                         int per_knob);

}  // namespace trainer::bench
