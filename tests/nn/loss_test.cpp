#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "nn/functional.h"

namespace trainer {
namespace {

using testing::random_tensor;

Tensor targets_of(const std::vector<int64_t>& t) {
  return Tensor::from_vector(t, {static_cast<int64_t>(t.size())});
}

// PyTorch: F.cross_entropy(tensor([[1., 2., 3.], [1., 1., 1.]]), tensor([2, 0])) = 0.7531 (sample losses
// log(1 + e^-1 + e^-2) and log 3).
TEST(CrossEntropyLoss, MatchesHandComputedValue) {
  Tensor logits = Tensor::from_vector<float>({1, 2, 3, 1, 1, 1}, {2, 3});
  auto [loss, probs] = cpu_backend().cross_entropy(logits, targets_of({2, 0}), 0.0);
  const std::vector<double> l = loss.to_vector<double>();
  EXPECT_NEAR(l[0], std::log(1 + std::exp(-1.0) + std::exp(-2.0)), 1e-6);
  EXPECT_NEAR(l[1], std::log(3.0), 1e-6);
  const std::vector<double> p = probs.to_vector<double>();
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  EXPECT_NEAR(p[0], std::exp(1.0) / z, 1e-6);
  EXPECT_NEAR(p[2], std::exp(3.0) / z, 1e-6);
  EXPECT_NEAR(p[4], 1.0 / 3.0, 1e-6);

  Variable mean = F::cross_entropy(Variable(logits), targets_of({2, 0}));
  EXPECT_EQ(mean.dim(), 0);
  EXPECT_NEAR(mean.item(), 0.7531091265562453, 1e-6);
}

// PyTorch: CrossEntropyLoss(label_smoothing=0.1) on the same example gives 0.8031:
// sample 0: 0.9 * (lse - 3) + 0.1 * (lse - mean(1, 2, 3)) = lse - 2.9, lse = 3.40760596.
TEST(CrossEntropyLoss, LabelSmoothingValue) {
  Tensor logits = Tensor::from_vector<double>({1, 2, 3, 1, 1, 1}, {2, 3});
  auto [loss, probs] = cpu_backend().cross_entropy(logits, targets_of({2, 0}), 0.1);
  const std::vector<double> l = loss.to_vector<double>();
  EXPECT_NEAR(l[0], 0.5076059644443807, 1e-12);
  EXPECT_NEAR(l[1], std::log(3.0), 1e-12);
  EXPECT_NEAR(F::cross_entropy(Variable(logits), targets_of({2, 0}), 0.1).item(), 0.8031091265562453, 1e-12);
}

TEST(CrossEntropyLoss, GradcheckWithoutSmoothing) {
  Generator gen(11);
  Variable logits(random_tensor({3, 4}, gen, -2.0, 2.0), true);
  const Tensor t = targets_of({0, 3, 1});
  EXPECT_GRADCHECK([&](const std::vector<Variable>& in) { return F::cross_entropy(in[0], t, 0.0); },
                   {logits});
}

TEST(CrossEntropyLoss, GradcheckWithSmoothing) {
  Generator gen(12);
  Variable logits(random_tensor({3, 4}, gen, -2.0, 2.0), true);
  const Tensor t = targets_of({2, 2, 0});
  EXPECT_GRADCHECK([&](const std::vector<Variable>& in) { return F::cross_entropy(in[0], t, 0.1); },
                   {logits});
}

TEST(CrossEntropyLoss, GradientIsProbsMinusSmoothedTargetOverN) {
  Tensor logits = Tensor::from_vector<double>({1, 2, 3, 1, 1, 1}, {2, 3});
  Variable x(logits, true);
  F::cross_entropy(x, targets_of({2, 0}), 0.1).backward();
  const std::vector<double> g = x.grad().to_vector<double>();
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  const double off = 0.1 / 3, on = 0.9 + 0.1 / 3;
  EXPECT_NEAR(g[0], (std::exp(1.0) / z - off) / 2, 1e-12);
  EXPECT_NEAR(g[2], (std::exp(3.0) / z - on) / 2, 1e-12);
  EXPECT_NEAR(g[3], (1.0 / 3 - on) / 2, 1e-12);
  EXPECT_NEAR(g[4], (1.0 / 3 - off) / 2, 1e-12);
}

TEST(CrossEntropyLoss, StableForLargeLogits) {
  Tensor logits = Tensor::from_vector<float>({1000, 0, -1000, 0}, {2, 2});
  auto [loss, probs] = cpu_backend().cross_entropy(logits, targets_of({0, 0}), 0.0);
  const std::vector<double> l = loss.to_vector<double>();
  EXPECT_NEAR(l[0], 0.0, 1e-6);
  EXPECT_NEAR(l[1], 1000.0, 1e-3);
  EXPECT_TRUE(cpu_backend().all_finite(probs));
}

TEST(CrossEntropyLoss, NanLogitsPropagate) {
  Tensor logits = Tensor::from_vector<float>({1, NAN, 0, 1, 2, 3}, {2, 3});
  auto [loss, probs] = cpu_backend().cross_entropy(logits, targets_of({0, 1}), 0.1);
  const std::vector<double> l = loss.to_vector<double>();
  EXPECT_TRUE(std::isnan(l[0]));
  EXPECT_FALSE(std::isnan(l[1]));
  EXPECT_TRUE(std::isnan(F::cross_entropy(Variable(logits), targets_of({0, 1})).item()));
}

TEST(CrossEntropyLoss, TargetOutOfRangeNamesSampleAndValue) {
  Tensor logits = Tensor::zeros({3, 4});
  try {
    cpu_backend().cross_entropy(logits, targets_of({0, 7, 1}), 0.0);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("sample 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("7"), std::string::npos) << msg;
  }
  EXPECT_THROW(F::cross_entropy(Variable(logits), targets_of({0, 1, -1})), std::invalid_argument);
  EXPECT_THROW(F::cross_entropy(Variable(logits), targets_of({0, 1})), std::invalid_argument);
  EXPECT_THROW(F::cross_entropy(Variable(logits), Tensor::zeros({3})), std::invalid_argument);  // not i64
  EXPECT_THROW(F::cross_entropy(Variable(logits), targets_of({0, 1, 2}), 1.5), std::invalid_argument);
  EXPECT_THROW(F::cross_entropy(Variable(Tensor::zeros({3})), targets_of({0, 1, 2})), std::invalid_argument);
}

// K = 6. Row 2 ties the target with another logit at the max; row 4 ties it at the 5th place.
TEST(LossMetrics, TopkCountsWithTies) {
  Tensor logits = Tensor::from_vector<float>({0.1f, 0.9f, 0.3f, 0.2f, 0.0f, -1.0f,  // target 1: top-1
                                              0.5f, 0.4f, 0.9f, 0.0f, 0.1f, 0.2f,   // target 0: 2nd
                                              1,    3,    3,    0,    0,    0,      // target 2: tied 1st
                                              5,    4,    3,    2,    1,    0,      // target 5: last
                                              1,    2,    2,    2,    2,    1},     // target 5: tied 5th
                                             {5, 6});
  const Tensor t = targets_of({1, 0, 2, 5, 5});
  EXPECT_EQ(cpu_backend().topk_correct(logits, t, 1).to_vector<uint8_t>(),
            (std::vector<uint8_t>{1, 0, 1, 0, 0}));
  EXPECT_EQ(cpu_backend().topk_correct(logits, t, 5).to_vector<uint8_t>(),
            (std::vector<uint8_t>{1, 1, 1, 0, 1}));
  EXPECT_EQ(F::topk_correct(logits, t, 1), 2);
  EXPECT_EQ(F::topk_correct(logits, t, 5), 4);
  EXPECT_EQ(F::topk_correct(logits, t, 10), 5);  // k beyond K: every target is in
  EXPECT_THROW(F::topk_correct(logits, t, 0), std::invalid_argument);
  EXPECT_EQ(cpu_backend().argmax(logits).to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 1, 0, 1}));
}

TEST(LossMetrics, NanLogitsInMetrics) {
  Tensor logits = Tensor::from_vector<double>({NAN, 1, 2, 0, 1, NAN}, {2, 3});
  EXPECT_EQ(cpu_backend().topk_correct(logits, targets_of({0, 1}), 1).to_vector<uint8_t>(),
            (std::vector<uint8_t>{0, 0}));  // a NaN target misses; a NaN elsewhere outranks the target
  EXPECT_EQ(cpu_backend().argmax(logits).to_vector<int64_t>(), (std::vector<int64_t>{0, 2}));
}

}  // namespace
}  // namespace trainer
