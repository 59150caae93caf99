// F::bmm, F::scaled_dot_product_attention and F::packed_self_attention, attention composed on tensors
// (nn/composed_attention.h), the shape ops a ViT adds (expand, cat, slice) and the MultiheadAttention
// module: autograd wiring against finite differences, and values against loops written out here. The
// kernels themselves are in the op table (tests/op_cases/conv_matmul_cases.cpp, transformer_cases.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "nn/composed_attention.h"
#include "nn/functional.h"
#include "nn/modules/multihead_attention.h"

namespace trainer {
namespace {

using testing::gradcheck;
using testing::random_leaf;
using testing::random_tensor;

// softmax(q k^T / sqrt(d)) v for one [T, d] / [S, d] / [S, dv] slice, in plain loops.
std::vector<double> naive_attention(const std::vector<double>& q, const std::vector<double>& k,
                                    const std::vector<double>& v, int64_t t, int64_t s, int64_t d,
                                    int64_t dv) {
  std::vector<double> out(static_cast<size_t>(t * dv), 0.0);
  for (int64_t i = 0; i < t; ++i) {
    std::vector<double> w(static_cast<size_t>(s));
    double peak = -INFINITY, total = 0.0;
    for (int64_t j = 0; j < s; ++j) {
      double dot = 0.0;
      for (int64_t c = 0; c < d; ++c) dot += q[i * d + c] * k[j * d + c];
      w[j] = dot / std::sqrt(static_cast<double>(d));
      peak = std::max(peak, w[j]);
    }
    for (double& x : w) total += (x = std::exp(x - peak));
    for (int64_t j = 0; j < s; ++j)
      for (int64_t c = 0; c < dv; ++c) out[i * dv + c] += w[j] / total * v[j * dv + c];
  }
  return out;
}

TEST(Bmm, ProductsPerBatchEntryAndGradients) {
  Generator gen(11);
  const Variable a = random_leaf({3, 5, 7}, gen), b = random_leaf({3, 7, 11}, gen);
  const std::vector<double> y = F::bmm(a, b).data().to_vector<double>();
  const std::vector<double> x = a.data().to_vector<double>(), z = b.data().to_vector<double>();
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t r = 0; r < 5; ++r)
      for (int64_t c = 0; c < 11; ++c) {
        double expect = 0.0;
        for (int64_t k = 0; k < 7; ++k) expect += x[(i * 5 + r) * 7 + k] * z[(i * 7 + k) * 11 + c];
        EXPECT_NEAR(y[(i * 5 + r) * 11 + c], expect, 1e-13);
      }
  const auto r = gradcheck([](const std::vector<Variable>& in) { return F::bmm(in[0], in[1]); }, {a, b});
  EXPECT_LT(r.max_rel_error, 1e-7) << r.worst;
}

TEST(Bmm, PermutedViewsGiveTheProductsOfTheirCopies) {
  Generator gen(12);
  const Variable a = random_leaf({3, 7, 5}, gen), b = random_leaf({4, 3, 7}, gen);
  auto product = [](const std::vector<Variable>& in) {
    return F::bmm(F::permute(in[0], {0, 2, 1}), F::permute(in[1], {1, 2, 0}));  // [3, 5, 7] @ [3, 7, 4]
  };
  const Tensor copied =
      F::bmm(F::contiguous(F::permute(a, {0, 2, 1})), F::contiguous(F::permute(b, {1, 2, 0}))).data();
  const std::vector<double> in_place = product({a, b}).data().to_vector<double>(),
                            copy = copied.to_vector<double>();
  ASSERT_EQ(in_place.size(), copy.size());
  for (size_t i = 0; i < copy.size(); ++i) EXPECT_NEAR(in_place[i], copy[i], 1e-14) << i;
  const auto r = gradcheck(product, {a, b});
  EXPECT_LT(r.max_rel_error, 1e-7) << r.worst;
}

TEST(Bmm, RefusesMismatchedShapes) {
  const Variable a(Tensor::zeros({2, 3, 4})), b(Tensor::zeros({3, 4, 5})), c(Tensor::zeros({2, 5, 5}));
  EXPECT_THROW(F::bmm(a, b), std::invalid_argument);  // batch sizes differ
  EXPECT_THROW(F::bmm(a, c), std::invalid_argument);  // inner dimensions differ
  EXPECT_THROW(F::bmm(Variable(Tensor::zeros({3, 4})), Variable(Tensor::zeros({4, 5}))),
               std::invalid_argument);
}

TEST(Attention, MatchesLoopsAndFiniteDifferences) {
  Generator gen(21);
  const int64_t B = 2, H = 3, T = 5, S = 6, d = 4, dv = 3;
  const Variable q = random_leaf({B, H, T, d}, gen), k = random_leaf({B, H, S, d}, gen),
                 v = random_leaf({B, H, S, dv}, gen);
  const Variable out = F::scaled_dot_product_attention(q, k, v);
  ASSERT_EQ(out.shape(), (Shape{B, H, T, dv}));
  const std::vector<double> y = out.data().to_vector<double>(), qs = q.data().to_vector<double>(),
                            ks = k.data().to_vector<double>(), vs = v.data().to_vector<double>();
  for (int64_t bh = 0; bh < B * H; ++bh) {
    auto part = [bh](const std::vector<double>& all, int64_t n) {
      return std::vector<double>(all.begin() + bh * n, all.begin() + (bh + 1) * n);
    };
    const std::vector<double> expect =
        naive_attention(part(qs, T * d), part(ks, S * d), part(vs, S * dv), T, S, d, dv);
    for (int64_t i = 0; i < T * dv; ++i) EXPECT_NEAR(y[bh * T * dv + i], expect[i], 1e-13) << bh << " " << i;
  }
  const auto r = gradcheck(
      [](const std::vector<Variable>& in) { return F::scaled_dot_product_attention(in[0], in[1], in[2]); },
      {q, k, v});
  EXPECT_LT(r.max_rel_error, 1e-7) << r.worst;
}

TEST(Attention, PackedSelfAttentionIsAttentionOfTheHeadViews) {
  Generator gen(22);
  const int64_t N = 2, T = 5, H = 3, d = 4;
  const Variable qkv = random_leaf({N, T, 3, H, d}, gen);
  const Variable out = F::packed_self_attention(qkv);
  ASSERT_EQ(out.shape(), (Shape{N, T, H, d}));
  const Tensor& p = qkv.data();
  const Variable expect = F::scaled_dot_product_attention(Variable(packed_attention_head(p, 0)),
                                                          Variable(packed_attention_head(p, 1)),
                                                          Variable(packed_attention_head(p, 2)));
  const std::vector<double> got = out.data().to_vector<double>(),
                            want = expect.data().permute({0, 2, 1, 3}).to_vector<double>();
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << i;
  const auto r =
      gradcheck([](const std::vector<Variable>& in) { return F::packed_self_attention(in[0]); }, {qkv});
  EXPECT_LT(r.max_rel_error, 1e-7) << r.worst;
  EXPECT_THROW(F::packed_self_attention(Variable(Tensor::zeros({N, T, 2, H, d}))), std::invalid_argument);
}

// What stands in for a fused backward the backend cannot run: the recorded composition's gradients.
TEST(Attention, ComposedOnTensorsGivesTheRecordedCompositionsValuesAndGradients) {
  Generator gen(23);
  const Variable q = random_leaf({2, 3, 5, 4}, gen), k = random_leaf({2, 3, 6, 4}, gen),
                 v = random_leaf({2, 3, 6, 2}, gen);
  const Tensor dy = random_tensor({2, 3, 5, 2}, gen);
  Variable out = F::scaled_dot_product_attention(q, k, v);
  out.backward(dy);
  Backend& cpu = cpu_backend();
  const double scale = 0.5;  // 1 / sqrt(4)
  const std::vector<double> got = composed_attention(cpu, q.data(), k.data(), v.data(), scale)
                                      .to_vector<double>(),
                            want = out.data().to_vector<double>();
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-14) << i;
  const AttentionGrads g = composed_attention_backward(cpu, dy, q.data(), k.data(), v.data(), scale);
  for (const auto& [mine, autograd] :
       {std::pair{g.grad_q, q.grad()}, std::pair{g.grad_k, k.grad()}, std::pair{g.grad_v, v.grad()}}) {
    ASSERT_EQ(mine.shape(), autograd.shape());
    const std::vector<double> a = mine.to_vector<double>(), b = autograd.to_vector<double>();
    for (size_t i = 0; i < b.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-13) << i;
  }
  EXPECT_FALSE(g.packed.defined());
}

TEST(Attention, RefusesShapesThatDoNotPair) {
  const Variable q(Tensor::zeros({1, 2, 3, 4})), k(Tensor::zeros({1, 2, 5, 4})),
      v(Tensor::zeros({1, 2, 6, 4}));
  EXPECT_THROW(F::scaled_dot_product_attention(q, k, v), std::invalid_argument);  // S of k and v differ
  EXPECT_THROW(F::scaled_dot_product_attention(q, Variable(Tensor::zeros({1, 2, 5, 3})), k),
               std::invalid_argument);
}

TEST(ShapeOps, ExpandCatAndSliceGradients) {
  Generator gen(31);
  const Variable token = random_leaf({1, 1, 4}, gen), rest = random_leaf({3, 5, 4}, gen);
  const auto r = gradcheck(
      [](const std::vector<Variable>& in) {
        const Variable joined = F::cat({F::expand(in[0], {3, 1, 4}), in[1]}, 1);  // [3, 6, 4]
        return F::mul(F::slice(joined, 1, 0, 2), F::slice(joined, 1, 4, 6));      // [3, 2, 4]
      },
      {token, rest});
  EXPECT_LT(r.max_rel_error, 1e-8) << r.worst;
  const Variable joined = F::cat({F::expand(token, {3, 1, 4}), rest}, 1);
  ASSERT_EQ(joined.shape(), (Shape{3, 6, 4}));
  const std::vector<double> j = joined.data().to_vector<double>(), t = token.data().to_vector<double>(),
                            x = rest.data().to_vector<double>();
  for (int64_t n = 0; n < 3; ++n)
    for (int64_t c = 0; c < 4; ++c) {
      EXPECT_EQ(j[(n * 6) * 4 + c], t[c]);
      for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(j[(n * 6 + 1 + i) * 4 + c], x[(n * 5 + i) * 4 + c]);
    }
  EXPECT_THROW(F::cat({token, Variable(Tensor::zeros({1, 1, 3}, DType::f64))}, 1), std::invalid_argument);
  EXPECT_THROW(F::slice(rest, 1, 3, 6), std::invalid_argument);
}

TEST(MultiheadAttention, ParametersAreNamedAndInitialisedAsPyTorch) {
  Generator gen(41);
  MultiheadAttention mha(24, 4, gen);
  std::vector<std::string> names;
  for (const auto& p : mha.named_parameters()) names.push_back(p.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"}));
  EXPECT_EQ(mha.in_proj_weight().shape(), (Shape{72, 24}));
  EXPECT_EQ(mha.parameter_count(), 72 * 24 + 72 + 24 * 24 + 24);
  // xavier_uniform over the packed [3D, D] matrix: bound sqrt(6 / (3D + D)).
  const double bound = std::sqrt(6.0 / (72.0 + 24.0));
  double largest = 0.0;
  for (double w : mha.in_proj_weight().data().to_vector<float>()) largest = std::max(largest, std::abs(w));
  EXPECT_LE(largest, bound);
  EXPECT_GT(largest, 0.9 * bound);
  for (float b : mha.in_proj_bias().data().to_vector<float>()) EXPECT_EQ(b, 0.0f);
  for (float b : mha.out_proj().bias().data().to_vector<float>()) EXPECT_EQ(b, 0.0f);
  EXPECT_THROW(MultiheadAttention(10, 4, gen), std::invalid_argument);
}

// PyTorch's forward for one sample, written out: the packed projection, per-head attention, joined
// heads, out_proj.
TEST(MultiheadAttention, ForwardMatchesItsDefinitionAndGradientsMatch) {
  Generator gen(42);
  const int64_t N = 2, T = 3, D = 6, H = 2, hd = 3;
  MultiheadAttention mha(D, H, gen);
  mha.to(DType::f64);
  // Non-zero biases, so that their place in the formula is checked too.
  uniform_(mha.in_proj_bias().data(), -0.5, 0.5, gen);
  uniform_(mha.out_proj().bias().data(), -0.5, 0.5, gen);
  const Variable x = random_leaf({N, T, D}, gen);
  const std::vector<double> y = mha.forward(x).data().to_vector<double>();
  const std::vector<double> xs = x.data().to_vector<double>(),
                            w = mha.in_proj_weight().data().to_vector<double>(),
                            bias = mha.in_proj_bias().data().to_vector<double>(),
                            wo = mha.out_proj().weight().data().to_vector<double>(),
                            bo = mha.out_proj().bias().data().to_vector<double>();
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> joined(static_cast<size_t>(T * D));
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> q(T * hd), k(T * hd), v(T * hd);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < hd; ++c)
          for (int which = 0; which < 3; ++which) {
            const int64_t row = which * D + h * hd + c;
            double s = bias[row];
            for (int64_t i = 0; i < D; ++i) s += w[row * D + i] * xs[(n * T + t) * D + i];
            (which == 0 ? q : which == 1 ? k : v)[t * hd + c] = s;
          }
      const std::vector<double> head = naive_attention(q, k, v, T, T, hd, hd);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < hd; ++c) joined[t * D + h * hd + c] = head[t * hd + c];
    }
    for (int64_t t = 0; t < T; ++t)
      for (int64_t o = 0; o < D; ++o) {
        double s = bo[o];
        for (int64_t i = 0; i < D; ++i) s += wo[o * D + i] * joined[t * D + i];
        EXPECT_NEAR(y[(n * T + t) * D + o], s, 1e-13) << n << " " << t << " " << o;
      }
  }
  std::vector<Variable> inputs{x};
  for (const auto& p : mha.named_parameters()) inputs.push_back(p.param);
  const auto r = gradcheck([&mha](const std::vector<Variable>& in) { return mha.forward(in[0]); }, inputs);
  EXPECT_LT(r.max_rel_error, 1e-7) << r.worst;
}

}  // namespace
}  // namespace trainer
