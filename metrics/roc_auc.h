#pragma once
// Area under the ROC curve, computed exactly (no thresholds, no trapezoids over a binned curve): the
// Mann-Whitney statistic, i.e. the probability that a random positive scores higher than a random
// negative, with ties counted 1/2. Equal to sklearn.metrics.roc_auc_score.
#include <cstdint>
#include <vector>

namespace trainer {

// scores[i] for sample i, positive[i] whether it belongs to the positive class. NaN when there are no
// positives or no negatives (the AUC is undefined).
double binary_auc(const std::vector<float>& scores, const std::vector<uint8_t>& positive);

// One-vs-rest macro AUC from per-sample class probabilities `probs` [N, K] (row-major) and labels in
// [0, K): the mean over classes of binary_auc(probs[:, c], label == c), over the classes that have
// both positives and negatives (sklearn raises instead; evaluation shards may lack a class). For K = 2
// it is the AUC of class 1's score, as sklearn's binary case. NaN when no class qualifies.
double one_vs_rest_auc(const std::vector<float>& probs, const std::vector<int64_t>& labels,
                       int64_t num_classes);

}  // namespace trainer
