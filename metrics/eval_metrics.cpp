#include "metrics/eval_metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "dist/comm.h"
#include "metrics/roc_auc.h"
#include "nn/functional.h"

namespace trainer {

namespace {

// Row-wise softmax of host logits [n, k], in double, stored as f32.
std::vector<float> softmax_rows(const std::vector<float>& logits, int64_t n, int64_t k) {
  std::vector<float> out(logits.size());
  for (int64_t i = 0; i < n; ++i) {
    const float* z = logits.data() + i * k;
    const double mx = *std::max_element(z, z + k);
    double total = 0.0;
    for (int64_t c = 0; c < k; ++c) total += std::exp(static_cast<double>(z[c]) - mx);
    for (int64_t c = 0; c < k; ++c) out[i * k + c] = static_cast<float>(std::exp(z[c] - mx) / total);
  }
  return out;
}

}  // namespace

EvalMetrics::EvalMetrics(int64_t num_classes, bool keep_scores)
    : num_classes_(num_classes),
      keep_scores_(keep_scores),
      confusion_(static_cast<size_t>(num_classes * num_classes), 0) {}

void EvalMetrics::add_batch(const Tensor& logits, const Tensor& targets, const Tensor& per_sample_loss,
                            const Tensor& probs) {
  const int64_t n = logits.size(0);
  if (keep_scores_) {
    if (logits.size(1) != num_classes_)
      throw std::invalid_argument("EvalMetrics: logits have " + std::to_string(logits.size(1)) +
                                  " classes, expected " + std::to_string(num_classes_));
    const std::vector<float> p =
        probs.defined() ? probs.to_vector<float>() : softmax_rows(logits.to_vector<float>(), n, num_classes_);
    scores_.insert(scores_.end(), p.begin(), p.end());
    const std::vector<int64_t> t = targets.to_vector<int64_t>();
    labels_.insert(labels_.end(), t.begin(), t.end());
  }
  top1_ += F::topk_correct(logits, targets, 1);
  top5_ += F::topk_correct(logits, targets, static_cast<int>(std::min<int64_t>(5, logits.size(1))));
  for (double l : per_sample_loss.to_vector<double>()) loss_sum_ += l;
  const std::vector<int64_t> pred = backend_for(logits).argmax(logits).to_vector<int64_t>();
  const std::vector<int64_t> tgt = targets.to_vector<int64_t>();
  for (int64_t i = 0; i < n; ++i) ++confusion_[tgt[i] * num_classes_ + pred[i]];
  count_ += n;
}

void EvalMetrics::merge(const EvalMetrics& other) {
  if (other.num_classes_ != num_classes_)
    throw std::invalid_argument("EvalMetrics::merge: class counts differ");
  count_ += other.count_;
  top1_ += other.top1_;
  top5_ += other.top5_;
  loss_sum_ += other.loss_sum_;
  for (size_t i = 0; i < confusion_.size(); ++i) confusion_[i] += other.confusion_[i];
  if (keep_scores_) {
    if (!other.keep_scores_) throw std::invalid_argument("EvalMetrics::merge: the other one kept no scores");
    scores_.insert(scores_.end(), other.scores_.begin(), other.scores_.end());
    labels_.insert(labels_.end(), other.labels_.begin(), other.labels_.end());
  }
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

double EvalMetrics::auc() const {
  if (!keep_scores_ || labels_.empty() || num_classes_ < 2) return std::numeric_limits<double>::quiet_NaN();
  return one_vs_rest_auc(scores_, labels_, num_classes_);
}

EvalMetrics combine_across_ranks(const EvalMetrics& local, Comm& comm) {
  if (comm.world_size() == 1) return local;
  const std::vector<double> local_sums = local.sums();
  Tensor sums = Tensor::from_vector(local_sums, {static_cast<int64_t>(local_sums.size())});
  comm.all_reduce(sums, ReduceOp::sum);
  EvalMetrics out = EvalMetrics::from_sums(local.num_classes(), sums.to_vector<double>());
  if (!local.keeps_scores()) return out;
  // Exact, variable-length: shards differ by one sample; nothing padded, nothing dropped.
  const int64_t n = static_cast<int64_t>(local.labels().size()), k = local.num_classes();
  const std::vector<Tensor> scores = comm.all_gather(Tensor::from_vector(local.scores(), {n, k}));
  const std::vector<Tensor> labels = comm.all_gather(Tensor::from_vector(local.labels(), {n}));
  out.keep_scores_ = true;
  for (size_t r = 0; r < scores.size(); ++r) {
    const std::vector<float> s = scores[r].to_vector<float>();
    const std::vector<int64_t> l = labels[r].to_vector<int64_t>();
    out.scores_.insert(out.scores_.end(), s.begin(), s.end());
    out.labels_.insert(out.labels_.end(), l.begin(), l.end());
  }
  if (static_cast<int64_t>(out.labels_.size()) != out.count())
    throw std::logic_error("combine_across_ranks: gathered " + std::to_string(out.labels_.size()) +
                           " labels for " + std::to_string(out.count()) + " samples");
  return out;
}

}  // namespace trainer
