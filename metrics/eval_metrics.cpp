#include "metrics/eval_metrics.h"

#include <algorithm>
#include <stdexcept>

#include "nn/functional.h"

namespace trainer {

EvalMetrics::EvalMetrics(int64_t num_classes)
    : num_classes_(num_classes), confusion_(static_cast<size_t>(num_classes * num_classes), 0) {}

void EvalMetrics::add_batch(const Tensor& logits, const Tensor& targets, const Tensor& per_sample_loss) {
  const int64_t n = logits.size(0);
  top1_ += F::topk_correct(logits, targets, 1);
  top5_ += F::topk_correct(logits, targets, static_cast<int>(std::min<int64_t>(5, logits.size(1))));
  for (double l : per_sample_loss.to_vector<double>()) loss_sum_ += l;
  const std::vector<int64_t> pred = backend_for(logits).argmax(logits).to_vector<int64_t>();
  const std::vector<int64_t> tgt = targets.to_vector<int64_t>();
  for (int64_t i = 0; i < n; ++i) ++confusion_[tgt[i] * num_classes_ + pred[i]];
  count_ += n;
}

void EvalMetrics::merge(const EvalMetrics& other) {
  if (other.num_classes_ != num_classes_) throw std::invalid_argument("EvalMetrics::merge: class counts differ");
  count_ += other.count_;
  top1_ += other.top1_;
  top5_ += other.top5_;
  loss_sum_ += other.loss_sum_;
  for (size_t i = 0; i < confusion_.size(); ++i) confusion_[i] += other.confusion_[i];
}

std::vector<double> EvalMetrics::sums() const {
  std::vector<double> s{static_cast<double>(count_), static_cast<double>(top1_), static_cast<double>(top5_),
                        loss_sum_};
  for (int64_t c : confusion_) s.push_back(static_cast<double>(c));
  return s;
}

EvalMetrics EvalMetrics::from_sums(int64_t num_classes, const std::vector<double>& s) {
  EvalMetrics m(num_classes);
  if (s.size() != 4 + m.confusion_.size()) throw std::invalid_argument("EvalMetrics::from_sums: wrong size");
  m.count_ = static_cast<int64_t>(s[0]);  // counts below 2^53 are exact in a double
  m.top1_ = static_cast<int64_t>(s[1]);
  m.top5_ = static_cast<int64_t>(s[2]);
  m.loss_sum_ = s[3];
  for (size_t i = 0; i < m.confusion_.size(); ++i) m.confusion_[i] = static_cast<int64_t>(s[4 + i]);
  return m;
}

std::vector<double> EvalMetrics::per_class_accuracy() const {
  std::vector<double> acc(num_classes_, 0.0);
  for (int64_t c = 0; c < num_classes_; ++c) {
    int64_t total = 0;
    for (int64_t p = 0; p < num_classes_; ++p) total += confusion_[c * num_classes_ + p];
    acc[c] = total ? static_cast<double>(confusion_[c * num_classes_ + c]) / total : 0.0;
  }
  return acc;
}

}  // namespace trainer
