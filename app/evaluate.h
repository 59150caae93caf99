#pragma once
// Evaluation of a model over a dataset in eval mode, without autograd, with exact metrics.
#include "app/experiment.h"
#include "metrics/eval_metrics.h"

namespace trainer {

// Evaluates this rank's EvalShard of `dataset` (the whole dataset at world size 1).
EvalMetrics evaluate(Experiment& e, const Dataset& dataset, int rank = 0);

}  // namespace trainer
