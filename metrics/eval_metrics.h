#pragma once
// Classification metrics from sufficient statistics (sums and counts), so that partial results from
// several ranks combine exactly by addition: no padding, no duplicates, no averaging of averages.
#include <cstdint>
#include <vector>

#include "nn/tensor.h"

namespace trainer {

class EvalMetrics {
 public:
  explicit EvalMetrics(int64_t num_classes);

  // logits [N, K] (any float dtype/device), targets i64 [N], per-sample losses [N].
  void add_batch(const Tensor& logits, const Tensor& targets, const Tensor& per_sample_loss);
  // Adds another accumulator's statistics (another rank's shard).
  void merge(const EvalMetrics& other);
  // Every statistic as one vector of sums (count, top1, top5, loss sum, confusion matrix), so that
  // ranks combine exactly with one all-reduce(sum); from_sums() is the inverse.
  std::vector<double> sums() const;
  static EvalMetrics from_sums(int64_t num_classes, const std::vector<double>& sums);

  int64_t count() const { return count_; }
  double top1() const { return count_ ? static_cast<double>(top1_) / count_ : 0.0; }
  double top5() const { return count_ ? static_cast<double>(top5_) / count_ : 0.0; }
  double mean_loss() const { return count_ ? loss_sum_ / count_ : 0.0; }
  // confusion[target][prediction]
  const std::vector<int64_t>& confusion() const { return confusion_; }
  std::vector<double> per_class_accuracy() const;
  int64_t num_classes() const { return num_classes_; }

 private:
  int64_t num_classes_;
  int64_t count_ = 0, top1_ = 0, top5_ = 0;
  double loss_sum_ = 0.0;
  std::vector<int64_t> confusion_;
};

}  // namespace trainer
