#pragma once
// Evaluation of a model over a dataset in eval mode, without autograd, with exact metrics.
#include "app/experiment.h"
#include "metrics/eval_metrics.h"

namespace trainer {

class Comm;

// Evaluates this rank's EvalShard of `dataset` (every sample on exactly one rank, no padding) and,
// given a communicator, combines the ranks' sums exactly so every rank returns the global metrics.
EvalMetrics evaluate(Experiment& e, const Dataset& dataset, Comm* comm = nullptr);

}  // namespace trainer
