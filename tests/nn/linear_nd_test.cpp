// F::linear and Linear on inputs of any rank [..., in], as PyTorch's, and the copy-free path for a
// channels-last map permuted to [N, H, W, C] (ConvNeXt's per-pixel MLP).
#include <gtest/gtest.h>

#include <vector>

#include "gradcheck.h"
#include "nn/functional.h"
#include "nn/modules/linear.h"

namespace trainer {
namespace {

using testing::random_tensor;

void expect_near(const Tensor& a, const Tensor& b, double tol) {
  ASSERT_EQ(a.shape(), b.shape());
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], y[i], tol) << "element " << i;
}

TEST(LinearNd, EqualsTheTwoDimensionalProductRowByRow) {
  Generator gen(41);
  const Tensor x = random_tensor({2, 3, 4, 5}, gen), w = random_tensor({6, 5}, gen),
               b = random_tensor({6}, gen);
  const Variable y = F::linear(Variable(x), Variable(w), Variable(b));
  EXPECT_EQ(y.shape(), (Shape{2, 3, 4, 6}));
  const Variable rows = F::linear(Variable(x.reshape({24, 5})), Variable(w), Variable(b));
  expect_near(y.data().reshape({24, 6}), rows.data(), 1e-14);
  // A vector [in] gives [out], as torch.nn.functional.linear does.
  const Variable v = F::linear(Variable(x.reshape({-1}).slice(0, 0, 5)), Variable(w), Variable(b));
  EXPECT_EQ(v.shape(), (Shape{6}));
  expect_near(v.data(), rows.data().slice(0, 0, 1).reshape({6}), 1e-14);
}

TEST(LinearNd, Gradcheck) {
  Generator gen(42);
  Variable x(random_tensor({2, 3, 4}, gen), true), w(random_tensor({5, 4}, gen), true),
      b(random_tensor({5}, gen), true);
  EXPECT_GRADCHECK([](const std::vector<Variable>& in) { return F::linear(in[0], in[1], in[2]); }, {x, w, b});
}

TEST(LinearNd, ChannelsLastMapPermutedToNhwcIsUsedWithoutACopy) {
  Generator gen(43);
  const Tensor nchw = random_tensor({2, 4, 3, 5}, gen);
  const Tensor cl = nchw.contiguous(MemoryFormat::channels_last);
  const Variable nhwc = F::permute(Variable(cl), {0, 2, 3, 1});  // [N, H, W, C]
  EXPECT_TRUE(nhwc.data().is_contiguous());
  EXPECT_TRUE(F::reshape(nhwc, {-1, 4}).data().same_storage(cl));  // the GEMM's rows are x's memory

  // A strided (NCHW) map permuted the same way is copied once, with the same result.
  const Tensor w = random_tensor({3, 4}, gen);
  const Variable from_cl = F::linear(nhwc, Variable(w), Variable());
  const Variable from_nchw = F::linear(F::permute(Variable(nchw), {0, 2, 3, 1}), Variable(w), Variable());
  EXPECT_EQ(from_cl.shape(), (Shape{2, 3, 5, 3}));
  expect_near(from_cl.data(), from_nchw.data(), 1e-14);
}

TEST(LinearNd, ModuleTakesAnyLeadingDimensions) {
  Generator gen(44);
  Linear fc(4, 3, true, gen);
  Variable x(Tensor::ones({2, 5, 4}));
  Variable y = fc(x);
  EXPECT_EQ(y.shape(), (Shape{2, 5, 3}));
  F::sum(y).backward();
  for (float g : fc.weight().grad().to_vector<float>()) EXPECT_FLOAT_EQ(g, 10.0f);  // 10 rows of ones
  for (float g : fc.bias().grad().to_vector<float>()) EXPECT_FLOAT_EQ(g, 10.0f);
  EXPECT_THROW(fc(Variable(Tensor::ones({2, 5, 3}))), std::invalid_argument);
  EXPECT_THROW(fc(Variable(Tensor::scalar(1.0))), std::invalid_argument);
}

}  // namespace
}  // namespace trainer
