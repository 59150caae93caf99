#pragma once
// Classification metrics from sufficient statistics (sums and counts), so that partial results from
// several ranks combine exactly by addition: no padding, no duplicates, no averaging of averages.
// Optionally keeps every sample's class probabilities and label for ranking metrics (ROC-AUC), which
// do not decompose into sums: ranks combine them by an exact variable-length all-gather.
#include <cstdint>
#include <vector>

#include "nn/tensor.h"

namespace trainer {

class Comm;

class EvalMetrics {
 public:
  // keep_scores: also keep each sample's softmax probabilities (f32, N x K floats) and label, so that
  // auc() can be computed.
  explicit EvalMetrics(int64_t num_classes, bool keep_scores = false);

  // logits [N, K] (any float dtype/device), targets i64 [N], per-sample losses [N]. With keep_scores,
  // `probs` [N, K] are the softmax probabilities (computed from the logits when undefined).
  void add_batch(const Tensor& logits, const Tensor& targets, const Tensor& per_sample_loss,
                 const Tensor& probs = Tensor());
  // Adds another accumulator's statistics (another rank's shard); its scores are appended after ours.
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

  bool keeps_scores() const { return keep_scores_; }
  const std::vector<float>& scores() const { return scores_; }    // [count, K] row-major probabilities
  const std::vector<int64_t>& labels() const { return labels_; }  // [count]
  // One-vs-rest macro ROC-AUC (binary AUC of class 1 for 2 classes), see metrics/roc_auc.h; NaN
  // without kept scores or when undefined (a single class present).
  double auc() const;

 private:
  friend EvalMetrics combine_across_ranks(const EvalMetrics& local, Comm& comm);
  int64_t num_classes_;
  bool keep_scores_ = false;
  std::vector<float> scores_;
  std::vector<int64_t> labels_;
  int64_t count_ = 0, top1_ = 0, top5_ = 0;
  double loss_sum_ = 0.0;
  std::vector<int64_t> confusion_;
};

// Every rank's metrics combined exactly, returned on every rank: the sums with one all-reduce(sum);
// kept scores and labels with all_gather (shards may differ in length) concatenated in rank order,
// which for EvalShard's contiguous shards is the order of one rank evaluating everything, so auc()
// is bit-identical to a 1-rank evaluation. Every rank must call it; `local` is returned at world 1.
EvalMetrics combine_across_ranks(const EvalMetrics& local, Comm& comm);

}  // namespace trainer
