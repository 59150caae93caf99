// F::drop_path and the StochasticDepth module: torchvision's StochasticDepth(p, mode="row").
#include "nn/modules/stochastic_depth.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "gradcheck.h"
#include "nn/functional.h"

namespace trainer {
namespace {

using testing::random_tensor;

// Each sample of drop_path(ones) is all 0 or all 1/(1-p); returns the kept fraction.
double kept_fraction(const Tensor& y, double p) {
  const int64_t n = y.size(0), per_sample = y.numel() / n;
  const std::vector<float> v = y.to_vector<float>();
  int64_t kept = 0;
  for (int64_t s = 0; s < n; ++s) {
    const float first = v[s * per_sample];
    EXPECT_TRUE(first == 0.0f || first == static_cast<float>(1.0 / (1.0 - p)))
        << "sample " << s << ": " << first;
    for (int64_t i = 1; i < per_sample; ++i) EXPECT_EQ(v[s * per_sample + i], first) << "sample " << s;
    kept += first != 0.0f;
  }
  return static_cast<double>(kept) / n;
}

TEST(DropPath, KeepsWholeSamplesWithProbabilityOneMinusPScaled) {
  Generator gen(31);
  const double p = 0.2;
  const int64_t n = 4096;
  const Variable x(Tensor::ones({n, 3, 2, 2}));
  double sum = 0;
  const int draws = 10;
  for (int d = 0; d < draws; ++d) sum += kept_fraction(F::drop_path(x, p, true, gen).data(), p);
  // Standard error of the kept fraction over 40960 samples: sqrt(0.8 * 0.2 / 40960) ~ 2e-3.
  EXPECT_NEAR(sum / draws, 1.0 - p, 8e-3);
}

TEST(DropPath, PreservesTheMeanInExpectation) {
  Generator gen(32);
  const double p = 0.5;
  const Variable x(Tensor::full({20000, 3}, 2.0));
  const std::vector<float> y = F::drop_path(x, p, true, gen).data().to_vector<float>();
  double sum = 0;
  for (float v : y) sum += v;
  EXPECT_NEAR(sum / y.size(), 2.0, 0.05);  // standard error 2 * sqrt(1 / 20000) ~ 0.014
}

TEST(DropPath, IsDropoutsMaskDrawnOncePerSample) {
  Generator gen(33), replay(33);
  const Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2});
  const std::vector<float> y = F::drop_path(Variable(x), 0.5, true, gen).data().to_vector<float>();
  const std::vector<float> m = cpu_backend().dropout_mask({4, 1}, 0.5, DType::f32, replay).to_vector<float>();
  for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i], static_cast<float>(i + 1) * m[i / 2]);
  EXPECT_EQ(gen.state(), replay.state());  // one draw per sample, not per element
}

TEST(DropPath, EvalAndZeroPAreIdentityAndDrawNothing) {
  Generator gen(34);
  const std::string before = gen.state();
  Variable x(Tensor::ones({3, 2}), true);
  EXPECT_TRUE(F::drop_path(x, 0.5, false, gen).same(x));
  EXPECT_TRUE(F::drop_path(x, 0.0, true, gen).same(x));
  EXPECT_EQ(gen.state(), before);
}

TEST(DropPath, GradientIsTheSameMask) {
  Generator gen(35);
  Variable x(random_tensor({5, 2, 3}, gen), true);
  EXPECT_GRADCHECK(
      [](const std::vector<Variable>& in) {
        Generator g(42);  // the same mask on every call
        return F::drop_path(in[0], 0.4, true, g);
      },
      {x});
  // The gradient of sum(y) is the mask itself: per sample 0 or 1/(1-p), and 0 exactly where y is 0.
  x.zero_grad();
  Generator g(43);
  Variable y = F::drop_path(x, 0.4, true, g);
  F::sum(y).backward();
  const std::vector<double> grad = x.grad().to_vector<double>(), out = y.data().to_vector<double>(),
                            in = x.data().to_vector<double>();
  for (size_t i = 0; i < grad.size(); ++i) {
    EXPECT_TRUE(grad[i] == 0.0 || std::abs(grad[i] - 1.0 / 0.6) < 1e-12) << grad[i];
    EXPECT_DOUBLE_EQ(out[i], in[i] * grad[i]);
  }
}

TEST(DropPath, RejectsInvalidProbability) {
  Generator gen(36);
  Variable x(Tensor::ones({3}));
  EXPECT_THROW(F::drop_path(x, 1.0, true, gen), std::invalid_argument);
  EXPECT_THROW(F::drop_path(x, -0.1, false, gen), std::invalid_argument);
}

TEST(StochasticDepthModule, TrainingDropsSamplesEvalIsIdentity) {
  auto gen = std::make_shared<Generator>(37);
  StochasticDepth sd(0.3, gen);
  EXPECT_EQ(sd.parameter_count(), 0);
  EXPECT_TRUE(sd.state_dict().empty());
  const Variable x(Tensor::ones({2000, 4}));
  EXPECT_NEAR(kept_fraction(sd(x).data(), 0.3), 0.7, 0.04);  // standard error ~0.01
  sd.eval();
  EXPECT_TRUE(sd(x).same(x));
  EXPECT_THROW(StochasticDepth(1.0, gen), std::invalid_argument);
  EXPECT_THROW(StochasticDepth(0.1, nullptr), std::invalid_argument);
  EXPECT_NO_THROW(StochasticDepth(0.0, nullptr));  // never draws
}

}  // namespace
}  // namespace trainer
