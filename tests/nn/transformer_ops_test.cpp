// F::gelu, F::layer_norm, F::softmax and the LayerNorm module: the autograd wiring and the layout rules
// on top of the kernels the op table checks (tests/op_cases/transformer_cases.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "nn/amp/autocast.h"
#include "nn/functional.h"
#include "nn/modules/basic.h"
#include "nn/modules/layer_norm.h"

namespace trainer {
namespace {

using testing::gradcheck;
using testing::random_leaf;
using testing::random_tensor;

double max_abs_difference(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  double worst = 0.0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  return worst;
}

TEST(TransformerOps, GeluMatchesItsDefinitionAndFiniteDifferences) {
  const Tensor x = Tensor::from_vector(std::vector<double>{-3.0, -0.5, 0.0, 0.7, 2.5}, {5});
  const std::vector<double> erf_form = F::gelu(Variable(x)).data().to_vector<double>();
  const std::vector<double> tanh_form =
      F::gelu(Variable(x), F::GeluApproximation::tanh).data().to_vector<double>();
  const std::vector<double> v = x.to_vector<double>();
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_NEAR(erf_form[i], 0.5 * v[i] * (1.0 + std::erf(v[i] / std::sqrt(2.0))), 1e-15);
    const double inner = std::sqrt(2.0 / M_PI) * (v[i] + 0.044715 * v[i] * v[i] * v[i]);
    EXPECT_NEAR(tanh_form[i], 0.5 * v[i] * (1.0 + std::tanh(inner)), 1e-15);
  }
  Generator gen(3);
  for (F::GeluApproximation a : {F::GeluApproximation::none, F::GeluApproximation::tanh}) {
    const auto r = gradcheck([a](const std::vector<Variable>& in) { return F::gelu(in[0], a); },
                             {random_leaf({4, 9}, gen, -4.0, 4.0)});
    EXPECT_LT(r.max_rel_error, 1e-7) << r.worst;
  }
}

TEST(TransformerOps, SoftmaxRowsSumToOneAndGradientsMatch) {
  Generator gen(5);
  const Variable x =
      random_leaf({3, 4, 11}, gen, -50.0, 300.0);  // exp(300) would overflow even f64 without the shift
  const std::vector<double> y = F::softmax(x).data().to_vector<double>();
  for (int r = 0; r < 12; ++r) {
    double sum = 0.0;
    for (int c = 0; c < 11; ++c) sum += y[static_cast<size_t>(r * 11 + c)];
    EXPECT_NEAR(sum, 1.0, 1e-12) << "row " << r;
  }
  const auto grads = gradcheck([](const std::vector<Variable>& in) { return F::softmax(in[0]); },
                               {random_leaf({3, 4, 11}, gen, -3.0, 3.0)});
  EXPECT_LT(grads.max_rel_error, 1e-7) << grads.worst;
}

TEST(TransformerOps, LayerNormGradientsMatchFiniteDifferences) {
  Generator gen(7);
  const auto r = gradcheck(
      [](const std::vector<Variable>& in) { return F::layer_norm(in[0], 13, in[1], in[2], 1e-5); },
      {random_leaf({2, 3, 13}, gen, -2.0, 3.0), random_leaf({13}, gen, 0.5, 1.5), random_leaf({13}, gen)});
  EXPECT_LT(r.max_rel_error, 1e-6) << r.worst;
}

// ConvNeXt's LayerNorm2d is torch's last-dim layer norm on x.permute(0, 2, 3, 1): the channels-last
// path must give the same values and gradients without the permute.
TEST(TransformerOps, LayerNormOverChannelsEqualsLastDimOnThePermutedBatch) {
  Generator gen(11);
  const Tensor x = random_tensor({2, 6, 3, 5}, gen, -2.0, 2.0), seed = random_tensor({2, 6, 3, 5}, gen);
  const Tensor gamma = random_tensor({6}, gen, 0.5, 1.5), beta = random_tensor({6}, gen);

  LayerNorm over_channels(6, 1e-6, true, LayerNormOver::channels);
  over_channels.to(DType::f64);
  over_channels.weight().data().copy_(gamma);
  over_channels.bias().data().copy_(beta);
  Variable xa(x.clone(), true);  // contiguous NCHW: the module converts it to channels-last once
  Variable ya = over_channels.forward(xa);
  EXPECT_EQ(ya.data().suggest_memory_format(), MemoryFormat::channels_last);
  ya.backward(seed);

  Variable xb(x.clone(), true), wb(gamma.clone(), true), bb(beta.clone(), true);
  Variable yb =
      F::permute(F::layer_norm(F::contiguous(F::permute(xb, {0, 2, 3, 1})), 6, wb, bb, 1e-6), {0, 3, 1, 2});
  yb.backward(seed);

  EXPECT_LT(max_abs_difference(ya.data().contiguous(), yb.data().contiguous()), 1e-12);
  EXPECT_LT(max_abs_difference(xa.grad().contiguous(), xb.grad().contiguous()), 1e-12);
  EXPECT_LT(max_abs_difference(over_channels.weight().grad(), wb.grad()), 1e-12);
  EXPECT_LT(max_abs_difference(over_channels.bias().grad(), bb.grad()), 1e-12);
}

TEST(TransformerOps, LayerNormRefusesALayoutWhoseInnermostDimensionIsNotNormalised) {
  Generator gen(13);
  const Tensor x = random_tensor({2, 4, 3, 5}, gen);
  // Contiguous NCHW over C: the last dimension (W = 5) is innermost.
  EXPECT_THROW(F::layer_norm(Variable(x), 4, Variable(), Variable()), std::invalid_argument);
  // Channels-last over W: C is innermost.
  EXPECT_THROW(F::layer_norm(Variable(x.contiguous(MemoryFormat::channels_last)), 5, Variable(), Variable()),
               std::invalid_argument);
  // A transposed view is not dense along its last dimension.
  EXPECT_THROW(F::layer_norm(Variable(random_tensor({7, 3}, gen).permute({1, 0})), 7, Variable(), Variable()),
               std::invalid_argument);
  try {
    F::layer_norm(Variable(x), 4, Variable(), Variable());
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("HINT"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(F::layer_norm(Variable(x), 5, Variable(), Variable()));
  EXPECT_NO_THROW(
      F::layer_norm(Variable(x.contiguous(MemoryFormat::channels_last)), 4, Variable(), Variable()));
}

TEST(TransformerOps, LayerNormModuleHasTorchsParametersAndAcceptsAnyLayout) {
  LayerNorm norm(5);
  const std::vector<NamedTensor> state = norm.state_dict();
  ASSERT_EQ(state.size(), 2u);
  EXPECT_EQ(state[0].name, "weight");
  EXPECT_EQ(state[1].name, "bias");
  EXPECT_EQ(state[0].tensor->to_vector<float>(), std::vector<float>(5, 1.0f));
  EXPECT_EQ(state[1].tensor->to_vector<float>(), std::vector<float>(5, 0.0f));
  EXPECT_TRUE(LayerNorm(5, 1e-5, false).state_dict().empty());
  // Last-dim mode on a channels-last batch (W = 5): copied to contiguous first.
  Generator gen(17);
  const Tensor x = random_tensor({2, 4, 3, 5}, gen).to(DType::f32);
  const Tensor from_contiguous = norm.forward(Variable(x)).data();
  const Tensor from_channels_last = norm.forward(Variable(x.contiguous(MemoryFormat::channels_last))).data();
  EXPECT_EQ(from_contiguous.to_vector<float>(), from_channels_last.contiguous().to_vector<float>());
  EXPECT_THROW(norm.forward(Variable(Tensor::zeros({2, 4}))), std::invalid_argument);
  EXPECT_THROW(LayerNorm(4, 1e-5, true, LayerNormOver::channels).forward(Variable(Tensor::zeros({2, 4}))),
               std::invalid_argument);
}

// A ViT's LayerNorm under bf16 autocast stores its output as bf16 (its consumers are matmuls that
// round it there anyway): the values and every gradient must equal PyTorch's order of operations,
// an f32 layer norm whose output is then cast to bf16, bit for bit.
TEST(TransformerOps, ALayerNormFeedingMatmulsStoresBf16AsTheCastAfterItWould) {
  Generator gen(19);
  const Tensor x = random_tensor({3, 5, 24}, gen, -2.0, 3.0).to(DType::f32);
  const Tensor seed = random_tensor({3, 5, 24}, gen).to(DType::bf16);
  LayerNorm fused(24, 1e-6);
  fused.weight().data().copy_(random_tensor({24}, gen, 0.5, 1.5));
  fused.bias().data().copy_(random_tensor({24}, gen));
  fused.set_output_feeds_matmuls(true);
  Variable xa(x.clone(), true), wb(fused.weight().data().clone(), true),
      bb(fused.bias().data().clone(), true);
  Variable ya;
  {
    AutocastScope autocast(DType::bf16);
    ya = fused.forward(xa);
  }
  EXPECT_EQ(ya.dtype(), DType::bf16);
  ya.backward(seed);

  Variable xb(x.clone(), true);
  Variable yb = F::to_dtype(F::layer_norm(xb, 24, wb, bb, 1e-6), DType::bf16);
  yb.backward(seed);

  EXPECT_EQ(max_abs_difference(ya.data(), yb.data()), 0.0);
  EXPECT_EQ(xa.grad().dtype(), DType::f32);
  EXPECT_EQ(max_abs_difference(xa.grad(), xb.grad()), 0.0);
  EXPECT_EQ(max_abs_difference(fused.weight().grad(), wb.grad()), 0.0);
  EXPECT_EQ(max_abs_difference(fused.bias().grad(), bb.grad()), 0.0);

  // Outside autocast, or without the promise, the output keeps x's dtype.
  EXPECT_EQ(fused.forward(Variable(x)).dtype(), DType::f32);
  LayerNorm plain(24, 1e-6);
  AutocastScope autocast(DType::bf16);
  EXPECT_EQ(plain.forward(Variable(x)).dtype(), DType::f32);
}

// A residual add under autocast (f32 stream + bf16 branch) widens the branch as it reads it: the
// result and the gradients equal the explicit cast's, in either operand order; other mixes throw.
TEST(TransformerOps, AddingAHalfTensorToAnF32OneEqualsCastingItFirst) {
  Generator gen(23);
  const Tensor stream = random_tensor({2, 3, 8}, gen).to(DType::f32);
  const Tensor branch = random_tensor({2, 3, 8}, gen).to(DType::bf16);
  const Tensor seed = random_tensor({2, 3, 8}, gen).to(DType::f32);
  for (bool half_first : {false, true}) {
    Variable sa(stream.clone(), true), ba(branch.clone(), true);
    Variable ya = half_first ? F::add(ba, sa) : F::add(sa, ba);
    EXPECT_EQ(ya.dtype(), DType::f32);
    ya.backward(seed);
    Variable sb(stream.clone(), true), bb(branch.clone(), true);
    Variable yb = F::add(sb, F::to_dtype(bb, DType::f32));
    yb.backward(seed);
    EXPECT_EQ(max_abs_difference(ya.data(), yb.data()), 0.0);
    EXPECT_EQ(ba.grad().dtype(), DType::bf16);
    EXPECT_EQ(max_abs_difference(ba.grad(), bb.grad()), 0.0);
    EXPECT_EQ(max_abs_difference(sa.grad(), sb.grad()), 0.0);
  }
  EXPECT_THROW(F::mul(Variable(stream), Variable(branch)), std::invalid_argument);
  EXPECT_THROW(F::add(Variable(stream), Variable(branch.reshape({6, 8}))), std::invalid_argument);
}

TEST(TransformerOps, GeluModuleUsesItsApproximation) {
  const Tensor x = Tensor::from_vector(std::vector<float>{-1.5f, 0.3f, 2.0f}, {3});
  EXPECT_EQ(GELU().forward(Variable(x)).data().to_vector<float>(),
            F::gelu(Variable(x)).data().to_vector<float>());
  EXPECT_EQ(GELU(F::GeluApproximation::tanh).forward(Variable(x)).data().to_vector<float>(),
            F::gelu(Variable(x), F::GeluApproximation::tanh).data().to_vector<float>());
}

}  // namespace
}  // namespace trainer
