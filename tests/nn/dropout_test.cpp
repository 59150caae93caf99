#include <gtest/gtest.h>

#include <vector>

#include "gradcheck.h"
#include "nn/functional.h"

namespace trainer {
namespace {

using testing::random_tensor;

TEST(Dropout, Gradcheck) {
  Generator gen(21);
  Variable x(random_tensor({3, 4}, gen), true);
  EXPECT_GRADCHECK(
      [](const std::vector<Variable>& in) {
        Generator g(42);  // the same mask on every call
        return F::dropout(in[0], 0.3, true, g);
      },
      {x});
}

TEST(Dropout, MaskStatistics) {
  Generator gen(22);
  const double p = 0.3;
  const int64_t n = 1 << 20;
  const std::vector<float> m = cpu_backend().dropout_mask({n}, p, DType::f32, gen).to_vector<float>();
  double sum = 0;
  int64_t zeros = 0;
  for (float v : m) {
    sum += v;
    if (v == 0.0f)
      ++zeros;
    else
      ASSERT_FLOAT_EQ(v, static_cast<float>(1.0 / (1.0 - p)));
  }
  // Standard errors: mean sqrt(p / (1 - p) / n) ~ 6.4e-4, fraction sqrt(p (1 - p) / n) ~ 4.5e-4.
  EXPECT_NEAR(sum / n, 1.0, 5e-3);
  EXPECT_NEAR(static_cast<double>(zeros) / n, p, 3e-3);
}

TEST(Dropout, MaskDrawsOneUniformPerElementInOrder) {
  Generator a(23), b(23);
  const std::vector<double> m = cpu_backend().dropout_mask({4, 5}, 0.5, DType::f64, a).to_vector<double>();
  for (double v : m) EXPECT_EQ(v, b.uniform() < 0.5 ? 0.0 : 2.0);
  EXPECT_EQ(a.state(), b.state());
}

TEST(Dropout, TrainingMultipliesByMask) {
  Generator gen(24), replay(24);
  Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  const std::vector<float> y = F::dropout(Variable(x), 0.5, true, gen).data().to_vector<float>();
  const std::vector<float> m = cpu_backend().dropout_mask({2, 3}, 0.5, DType::f32, replay).to_vector<float>();
  for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i], static_cast<float>(i + 1) * m[i]);
}

TEST(Dropout, EvalAndZeroPAreIdentity) {
  Generator gen(25);
  const std::string before = gen.state();
  Variable x(Tensor::from_vector<float>({1, 2, 3}, {3}), true);
  Variable y = F::dropout(x, 0.5, false, gen);
  EXPECT_TRUE(y.same(x));
  EXPECT_TRUE(F::dropout(x, 0.0, true, gen).same(x));
  EXPECT_EQ(gen.state(), before);  // no draws
}

TEST(Dropout, RejectsInvalidProbability) {
  Generator gen(26);
  Variable x(Tensor::ones({3}));
  EXPECT_THROW(F::dropout(x, 1.0, true, gen), std::invalid_argument);
  EXPECT_THROW(F::dropout(x, -0.1, false, gen), std::invalid_argument);
  EXPECT_THROW(cpu_backend().dropout_mask({3}, 1.0, DType::f32, gen), std::invalid_argument);
  EXPECT_THROW(cpu_backend().dropout_mask({3}, 0.5, DType::i64, gen), std::invalid_argument);
}

}  // namespace
}  // namespace trainer
