#pragma once
// The JSON `trainer eval --summary PATH` writes: what was evaluated and every figure the command prints,
// per-class accuracy included (a training run's summary.json has other fields: app/train/summary.h).
#include <cstdint>
#include <string>
#include <vector>

namespace trainer {

struct EvalSummary {
  std::string weights;         // the weights file evaluated
  std::string dataset;         // the test split's name
  int64_t images = 0;          // images counted in the metrics
  int64_t skipped_images = 0;  // unreadable images left out (data.bad_samples = "skip")
  double loss = 0.0, top1 = 0.0, top5 = 0.0;
  double auc = 0.0;                      // NaN when not computed: written as null
  std::vector<std::string> class_names;  // index order; empty entries are named by their index
  std::vector<double> per_class_accuracy;
};

std::string eval_summary_json(const EvalSummary& s);
// Throws std::runtime_error naming `path` when it cannot be written.
void write_eval_summary(const std::string& path, const EvalSummary& s);

}  // namespace trainer
