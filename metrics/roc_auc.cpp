#include "metrics/roc_auc.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

namespace trainer {

double binary_auc(const std::vector<float>& scores, const std::vector<uint8_t>& positive) {
  if (scores.size() != positive.size())
    throw std::invalid_argument("binary_auc: " + std::to_string(scores.size()) + " scores but " +
                                std::to_string(positive.size()) + " labels");
  const int64_t n = static_cast<int64_t>(scores.size());
  for (float s : scores)
    if (std::isnan(s)) throw std::invalid_argument("binary_auc: a score is NaN (non-finite model output?)");
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return scores[a] < scores[b]; });
  // Twice the rank sum of the positives (ranks from 1, tied groups get their mean rank: 2 * mean rank
  // = first + last, an integer), so the statistic stays exact in integers.
  int64_t pos = 0, twice_rank_sum = 0;
  for (int64_t i = 0; i < n;) {
    int64_t j = i;
    while (j + 1 < n && scores[order[j + 1]] == scores[order[i]]) ++j;
    int64_t group_pos = 0;
    for (int64_t t = i; t <= j; ++t) group_pos += positive[order[t]] ? 1 : 0;
    twice_rank_sum += group_pos * ((i + 1) + (j + 1));
    pos += group_pos;
    i = j + 1;
  }
  const int64_t neg = n - pos;
  if (pos == 0 || neg == 0) return std::numeric_limits<double>::quiet_NaN();
  // U = R - P(P+1)/2 counts (positive, negative) pairs ordered correctly, ties as 1/2.
  const int64_t twice_u = twice_rank_sum - pos * (pos + 1);
  return static_cast<double>(twice_u) / (2.0 * static_cast<double>(pos) * static_cast<double>(neg));
}

double one_vs_rest_auc(const std::vector<float>& probs, const std::vector<int64_t>& labels,
                       int64_t num_classes) {
  const size_t n = labels.size();
  if (num_classes < 2 || probs.size() != n * static_cast<size_t>(num_classes))
    throw std::invalid_argument("one_vs_rest_auc: expected " + std::to_string(n) + " x " +
                                std::to_string(num_classes) + " probabilities, got " +
                                std::to_string(probs.size()));
  std::vector<float> score(n);
  std::vector<uint8_t> is_class(n);
  auto auc_of = [&](int64_t c) {
    for (size_t i = 0; i < n; ++i) {
      score[i] = probs[i * num_classes + c];
      is_class[i] = labels[i] == c;
    }
    return binary_auc(score, is_class);
  };
  if (num_classes == 2) return auc_of(1);
  double sum = 0.0;
  int64_t defined = 0;
  for (int64_t c = 0; c < num_classes; ++c) {
    const double a = auc_of(c);
    if (std::isnan(a)) continue;
    sum += a;
    ++defined;
  }
  return defined ? sum / static_cast<double>(defined) : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace trainer
