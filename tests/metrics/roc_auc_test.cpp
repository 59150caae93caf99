// ROC-AUC against hand-computed values (the Mann-Whitney count of correctly ordered positive/negative
// pairs, ties 1/2), the same numbers sklearn.metrics.roc_auc_score gives.
#include "metrics/roc_auc.h"

#include <gtest/gtest.h>

#include <cmath>

#include "metrics/eval_metrics.h"

namespace trainer {
namespace {

TEST(BinaryAuc, HandComputedExamples) {
  // Pairs (pos, neg): (0.35, 0.1) ok, (0.35, 0.4) wrong, (0.8, 0.1) ok, (0.8, 0.4) ok -> 3/4.
  EXPECT_DOUBLE_EQ(binary_auc({0.1f, 0.4f, 0.35f, 0.8f}, {0, 0, 1, 1}), 0.75);
  EXPECT_DOUBLE_EQ(binary_auc({0.1f, 0.2f, 0.3f}, {0, 1, 1}), 1.0);
  EXPECT_DOUBLE_EQ(binary_auc({0.1f, 0.2f, 0.3f}, {1, 0, 0}), 0.0);
}

TEST(BinaryAuc, TiesCountOneHalf) {
  EXPECT_DOUBLE_EQ(binary_auc({0.5f, 0.5f, 0.5f, 0.5f}, {0, 1, 0, 1}), 0.5);
  // (0.5, 0.1) 1, (0.5, 0.5) 1/2, (0.9, 0.1) 1, (0.9, 0.5) 1 -> 3.5 / 4.
  EXPECT_DOUBLE_EQ(binary_auc({0.1f, 0.5f, 0.5f, 0.9f}, {0, 1, 0, 1}), 0.875);
  // Order of samples does not matter.
  EXPECT_DOUBLE_EQ(binary_auc({0.9f, 0.5f, 0.1f, 0.5f}, {1, 0, 0, 1}), 0.875);
  // 3 positives, 2 negatives, a tie group mixing both: pos {0.2, 0.7, 0.7}, neg {0.7, 0.3}:
  // 0.2: 0 + 0; 0.7: 1/2 + 1 (twice) -> 3 / 6.
  EXPECT_DOUBLE_EQ(binary_auc({0.2f, 0.7f, 0.7f, 0.7f, 0.3f}, {1, 1, 1, 0, 0}), 0.5);
}

TEST(BinaryAuc, UndefinedWithOneClassAndErrors) {
  EXPECT_TRUE(std::isnan(binary_auc({0.1f, 0.2f}, {1, 1})));
  EXPECT_TRUE(std::isnan(binary_auc({}, {})));
  EXPECT_THROW(binary_auc({0.1f}, {1, 0}), std::invalid_argument);
  EXPECT_THROW(binary_auc({NAN, 0.2f}, {1, 0}), std::invalid_argument);
}

TEST(OneVsRestAuc, MacroAverageWithTies) {
  // class 0: pos {0.7, 0.3} vs neg {0.2, 0.1} -> 1
  // class 1: pos {0.2} vs neg {0.2 (tie), 0.3, 0.6} -> 0.5 / 3
  // class 2: pos {0.6} vs neg {0.1, 0.6 (tie), 0.1} -> 2.5 / 3
  const std::vector<float> probs = {0.7f, 0.2f, 0.1f,  //
                                    0.2f, 0.2f, 0.6f,  //
                                    0.1f, 0.3f, 0.6f,  //
                                    0.3f, 0.6f, 0.1f};
  EXPECT_DOUBLE_EQ(one_vs_rest_auc(probs, {0, 1, 2, 0}, 3), (1.0 + 0.5 / 3 + 2.5 / 3) / 3);
}

TEST(OneVsRestAuc, ClassesWithoutPositivesAreSkippedAndTwoClassesUseClassOne) {
  // Class 2 never occurs: the mean is over classes 0 and 1.
  // class 0: pos {0.4} vs neg {0.3, 0.6} -> 1/2; class 1: pos {0.6, 0.3} vs neg {0.5} -> 1/2.
  const std::vector<float> probs = {0.4f, 0.5f, 0.1f, 0.3f, 0.6f, 0.1f, 0.6f, 0.3f, 0.1f};
  EXPECT_DOUBLE_EQ(one_vs_rest_auc(probs, {0, 1, 1}, 3), 0.5);
  // Two classes: class 1's scores {0.1, 0.6, 0.7}, pos {0.6} vs neg {0.1, 0.7} -> 1/2.
  EXPECT_DOUBLE_EQ(one_vs_rest_auc({0.9f, 0.1f, 0.4f, 0.6f, 0.3f, 0.7f}, {0, 1, 0}, 2), 0.5);
  EXPECT_THROW(one_vs_rest_auc({0.1f}, {0, 1}, 3), std::invalid_argument);
}

TEST(EvalMetricsAuc, KeepsSoftmaxScoresAndLabels) {
  EvalMetrics m(2, true);
  // Logits -> softmax computed by EvalMetrics (no probabilities passed).
  const Tensor logits = Tensor::from_vector<float>({2.0f, 0.0f, 0.0f, 1.0f, 0.0f, 3.0f, 1.0f, 0.5f}, {4, 2});
  const Tensor labels = Tensor::from_vector<int64_t>({0, 1, 1, 0}, {4});
  m.add_batch(logits, labels, Tensor::zeros({4}));
  ASSERT_EQ(m.scores().size(), 8u);
  EXPECT_NEAR(m.scores()[0] + m.scores()[1], 1.0f, 1e-6f);
  EXPECT_EQ(m.labels(), (std::vector<int64_t>{0, 1, 1, 0}));
  EXPECT_DOUBLE_EQ(m.auc(), 1.0);
  EXPECT_TRUE(std::isnan(EvalMetrics(2).auc()));  // scores not kept
}

}  // namespace
}  // namespace trainer
