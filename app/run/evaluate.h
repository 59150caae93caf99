#pragma once
// Evaluation of a model over a dataset in eval mode, without autograd, with exact metrics.
#include <string>

#include "app/run/experiment.h"
#include "metrics/eval_metrics.h"

namespace trainer {

class Comm;

// Evaluates this rank's EvalShard of `dataset` (every sample on exactly one rank, no padding) and,
// given a communicator, combines the ranks' sums exactly so every rank returns the global metrics.
// Unreadable images that data.bad_samples = "skip" left out are not in the metrics; their number over
// all ranks goes to *skipped when given.
EvalMetrics evaluate(Experiment& e, const Dataset& dataset, Comm* comm = nullptr, int64_t* skipped = nullptr);

// Writes the first min(count, dataset size) samples of `dataset` as the model saw them in eval mode
// (normalized float "images" [N, C, H, W], "labels" [N]) and its "logits" [N, classes] to a
// safetensors file, so another framework can run the same weights on the same inputs and compare.
void dump_logits(Experiment& e, const Dataset& dataset, int64_t count, const std::string& path);

}  // namespace trainer
