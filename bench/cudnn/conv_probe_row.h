#pragma once
// One printed line of a convolution probe (bench/conv_probe_layers.h prints them): a way of running
// the convolution, how many of cuDNN's offers ran, and the fastest.
#include <cstdint>
#include <string>

namespace trainer::bench {

struct ConvProbeRow {
  std::string pattern;       // "conv alone", "ours: conv, then bn_mean_var", "conv + genstats (fused)", ...
  int engines = 0;           // distinct engines (or configurations) the heuristics offered
  int runnable = 0;          // of those, finalised and run
  float best_ms = -1.0f;     // the fastest that ran; -1 when none did
  int64_t best_engine = -1;  // its cuDNN global engine index
  std::string note;          // why nothing ran, or which engines needed runtime compilation
};

}  // namespace trainer::bench
