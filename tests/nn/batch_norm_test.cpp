#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "gradcheck.h"
#include "nn/functional.h"

namespace trainer {
namespace {

using testing::random_tensor;

constexpr double kEps = 1e-5;

// Reference batch norm over a contiguous [N, C, H, W] f64 tensor: y = (x - mean) / sqrt(var + eps) * w + b.
std::vector<double> reference_bn(const Tensor& x, const std::vector<double>& mean,
                                 const std::vector<double>& var, const std::vector<double>& w,
                                 const std::vector<double>& b) {
  const std::vector<double> v = x.to_vector<double>();
  const int64_t C = x.size(1), inner = x.size(2) * x.size(3);
  std::vector<double> y(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const int64_t c = (static_cast<int64_t>(i) / inner) % C;
    y[i] = (v[i] - mean[c]) / std::sqrt(var[c] + kEps) * w[c] + b[c];
  }
  return y;
}

// Per-channel {mean, biased var} of a [N, C, H, W] tensor, computed naively.
std::pair<std::vector<double>, std::vector<double>> reference_stats(const Tensor& x) {
  const std::vector<double> v = x.to_vector<double>();
  const int64_t C = x.size(1), inner = x.size(2) * x.size(3);
  const double n = static_cast<double>(x.numel() / C);
  std::vector<double> mean(C, 0.0), var(C, 0.0);
  for (size_t i = 0; i < v.size(); ++i) mean[(i / inner) % C] += v[i] / n;
  for (size_t i = 0; i < v.size(); ++i) {
    const double d = v[i] - mean[(i / inner) % C];
    var[(i / inner) % C] += d * d / n;
  }
  return {mean, var};
}

void expect_near(const std::vector<double>& a, const std::vector<double>& b, double tol) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], tol) << "element " << i;
}

TEST(BatchNorm, TrainingForwardMatchesReference) {
  Generator gen(1);
  Tensor x = random_tensor({3, 2, 2, 3}, gen, -2.0, 3.0);
  Tensor w = random_tensor({2}, gen), b = random_tensor({2}, gen);
  Tensor rm = Tensor::zeros({2}, DType::f64), rv = Tensor::ones({2}, DType::f64);
  Variable y = F::batch_norm(Variable(x), Variable(w), Variable(b), rm, rv, true, 0.1, kEps);
  auto [mean, var] = reference_stats(x);
  expect_near(y.data().to_vector<double>(),
              reference_bn(x, mean, var, w.to_vector<double>(), b.to_vector<double>()), 1e-12);
}

TEST(BatchNorm, ChannelsLastKeepsLayoutAndValues) {
  Generator gen(2);
  Tensor x = random_tensor({2, 3, 2, 2}, gen).to(DType::f32);
  Tensor x_cl = x.contiguous(MemoryFormat::channels_last);
  ASSERT_FALSE(x_cl.is_contiguous());
  Tensor w = random_tensor({3}, gen).to(DType::f32), b = random_tensor({3}, gen).to(DType::f32);
  Backend& k = cpu_backend();
  auto [m1, v1] = k.bn_mean_var(x);
  auto [m2, v2] = k.bn_mean_var(x_cl);
  expect_near(m1.to_vector<double>(), m2.to_vector<double>(), 1e-6);
  expect_near(v1.to_vector<double>(), v2.to_vector<double>(), 1e-6);
  Tensor invstd = k.binary_scalar(
      BinaryOp::div, k.unary(UnaryOp::sqrt, k.binary_scalar(BinaryOp::add, v1, kEps, false)), 1.0, true);
  Tensor y1 = k.bn_apply(x, m1, invstd, w, b, {});
  Tensor y2 = k.bn_apply(x_cl, m1, invstd, w, b, {});
  EXPECT_TRUE(y1.is_contiguous());
  EXPECT_TRUE(y2.is_contiguous(MemoryFormat::channels_last));
  expect_near(y1.to_vector<double>(), y2.to_vector<double>(), 1e-6);

  Tensor g = random_tensor({2, 3, 2, 2}, gen).to(DType::f32);  // NCHW gradient for a channels-last input
  auto [s1, t1] = k.bn_backward_reduce(g, x, m1, invstd, Tensor());
  auto [s2, t2] = k.bn_backward_reduce(g, x_cl, m1, invstd, Tensor());
  expect_near(s1.to_vector<double>(), s2.to_vector<double>(), 1e-5);
  expect_near(t1.to_vector<double>(), t2.to_vector<double>(), 1e-5);
  Tensor gx1 = k.bn_backward_input(g, x, m1, invstd, w, s1, t1, 8, Tensor());
  Tensor gx2 = k.bn_backward_input(g, x_cl, m1, invstd, w, s1, t1, 8, Tensor());
  EXPECT_TRUE(gx2.is_contiguous(MemoryFormat::channels_last));
  expect_near(gx1.to_vector<double>(), gx2.to_vector<double>(), 1e-5);
}

TEST(BatchNorm, FloatStatisticsStayAccurateWithLargeMean) {
  // 1000 + 0.25 * {0..7} per channel: var = 0.0625 * 5.25. One-pass float sums would lose it.
  std::vector<float> v;
  for (int c = 0; c < 2; ++c)
    for (int i = 0; i < 8; ++i) v.push_back(1000.0f * (c + 1) + 0.25f * i);
  Tensor x = Tensor::from_vector(v, {1, 2, 2, 4});
  auto [mean, var] = cpu_backend().bn_mean_var(x);
  expect_near(mean.to_vector<double>(), {1000.875, 2000.875}, 1e-6);
  expect_near(var.to_vector<double>(), {0.328125, 0.328125}, 1e-6);
}

TEST(BatchNorm, GradcheckTrainingWithoutAffine) {
  Generator gen(3);
  Tensor rm = Tensor::zeros({2}, DType::f64), rv = Tensor::ones({2}, DType::f64);
  Variable x(random_tensor({3, 2, 2, 2}, gen), true);
  EXPECT_GRADCHECK(
      [&](const std::vector<Variable>& in) {
        return F::batch_norm(in[0], Variable(), Variable(), rm, rv, true, 0.1, kEps);
      },
      {x});
}

TEST(BatchNorm, GradcheckTrainingWithAffine) {
  Generator gen(4);
  Tensor rm = Tensor::zeros({3}, DType::f64), rv = Tensor::ones({3}, DType::f64);
  Variable x(random_tensor({2, 3, 2, 2}, gen), true);
  Variable w(random_tensor({3}, gen, 0.5, 1.5), true), b(random_tensor({3}, gen), true);
  EXPECT_GRADCHECK(
      [&](const std::vector<Variable>& in) {
        return F::batch_norm(in[0], in[1], in[2], rm, rv, true, 0.1, kEps);
      },
      {x, w, b});
}

TEST(BatchNorm, GradcheckTrainingChannelsLast) {
  Generator gen(5);
  Tensor rm = Tensor::zeros({3}, DType::f64), rv = Tensor::ones({3}, DType::f64);
  Variable x(random_tensor({2, 3, 2, 2}, gen), true);
  Variable w(random_tensor({3}, gen, 0.5, 1.5), true), b(random_tensor({3}, gen), true);
  auto f = [&](const std::vector<Variable>& in) {
    Variable x_cl = F::contiguous(in[0], MemoryFormat::channels_last);
    return F::batch_norm(x_cl, in[1], in[2], rm, rv, true, 0.1, kEps);
  };
  EXPECT_TRUE(f({x, w, b}).data().is_contiguous(MemoryFormat::channels_last));
  EXPECT_GRADCHECK(f, {x, w, b});
}

TEST(BatchNorm, GradcheckTrainingTwoDimensionalInput) {
  Generator gen(6);
  Tensor rm = Tensor::zeros({3}, DType::f64), rv = Tensor::ones({3}, DType::f64);
  Variable x(random_tensor({4, 3}, gen), true);
  Variable w(random_tensor({3}, gen, 0.5, 1.5), true), b(random_tensor({3}, gen), true);
  EXPECT_GRADCHECK(
      [&](const std::vector<Variable>& in) {
        return F::batch_norm(in[0], in[1], in[2], rm, rv, true, 0.1, kEps);
      },
      {x, w, b});
}

// relu(bn(x) + residual) and relu(bn(x)) in one op: gradients (x, weight, bias and the residual) by
// finite differences, in training and evaluation mode, in both layouts.
TEST(BatchNorm, GradcheckFusedResidualAndRelu) {
  Generator gen(8);
  for (bool training : {true, false})
    for (MemoryFormat f : {MemoryFormat::contiguous, MemoryFormat::channels_last}) {
      {
        Tensor rm = random_tensor({3}, gen), rv = random_tensor({3}, gen, 0.5, 1.5);
        Variable x(random_tensor({2, 3, 3, 2}, gen), true);
        Variable w(random_tensor({3}, gen, 0.5, 1.5), true), b(random_tensor({3}, gen), true);
        EXPECT_GRADCHECK(
            [&](const std::vector<Variable>& in) {
              Tensor m = rm.clone(), v = rv.clone();
              return F::batch_norm(F::contiguous(in[0], f), in[1], in[2], m, v, training, 0.1, kEps,
                                   Variable(), true);
            },
            {x, w, b});
      }
      Tensor rm = random_tensor({3}, gen), rv = random_tensor({3}, gen, 0.5, 1.5);
      Variable x(random_tensor({2, 3, 3, 2}, gen), true), r(random_tensor({2, 3, 3, 2}, gen), true);
      Variable w(random_tensor({3}, gen, 0.5, 1.5), true), b(random_tensor({3}, gen), true);
      EXPECT_GRADCHECK(
          [&](const std::vector<Variable>& in) {
            Tensor m = rm.clone(), v = rv.clone();  // training updates them; each evaluation starts alike
            return F::batch_norm(F::contiguous(in[0], f), in[1], in[2], m, v, training, 0.1, kEps,
                                 F::contiguous(in[3], f), true);
          },
          {x, w, b, r});
    }
}

// A residual block's output feeds two ops: its gradient arrives in two parts, which the fused tail
// adds in the pass that applies the ReLU's mask (Node::backward_of_two). Finite differences check the
// gradients, and they equal those of the same graph whose two parts are added before the tail.
TEST(BatchNorm, FusedTailWhoseOutputFeedsTwoOps) {
  Generator gen(12);
  Tensor rm = random_tensor({3}, gen), rv = random_tensor({3}, gen, 0.5, 1.5);
  Variable x(random_tensor({2, 3, 3, 2}, gen), true), r(random_tensor({2, 3, 3, 2}, gen), true);
  Variable w(random_tensor({3}, gen, 0.5, 1.5), true), b(random_tensor({3}, gen), true);
  auto tail = [&](const std::vector<Variable>& in) {
    Tensor m = rm.clone(), v = rv.clone();
    return F::batch_norm(in[0], in[1], in[2], m, v, true, 0.1, kEps, in[3], true);
  };
  // y * y: exactly two parts reach the tail (one per operand), each depending on y.
  EXPECT_GRADCHECK(
      [&](const std::vector<Variable>& in) {
        const Variable y = tail(in);
        return F::mul(y, y);
      },
      {x, w, b, r});
  std::vector<std::vector<double>> grads[2];
  for (int summed_first = 0; summed_first < 2; ++summed_first) {
    Variable xi(x.data().clone(), true), ri(r.data().clone(), true), wi(w.data().clone(), true),
        bi(b.data().clone(), true);
    const Variable y = tail({xi, wi, bi, ri});
    const Variable a = F::mul(y, 2.0), c = F::mul(y, -0.75);
    // Two parts reach the tail, or one already added (the product of y and 1 + 0 keeps one consumer).
    const Variable out = summed_first ? F::mul(y, 1.25) : F::add(a, c);
    F::sum(F::mul(out, out)).backward();
    for (const Variable& v : {xi, wi, bi, ri}) grads[summed_first].push_back(v.grad().to_vector<double>());
  }
  for (size_t i = 0; i < grads[0].size(); ++i) expect_near(grads[0][i], grads[1][i], 1e-12);
}

// The fused tail gives the unfused ops' values and gradients (f32, so bit-for-bit up to rounding).
TEST(BatchNorm, FusedTailEqualsSeparateOps) {
  Generator gen(9);
  const Tensor x0 = random_tensor({4, 5, 3, 3}, gen).to(DType::f32);
  const Tensor r0 = random_tensor({4, 5, 3, 3}, gen).to(DType::f32);
  const Tensor w0 = random_tensor({5}, gen, 0.5, 1.5).to(DType::f32),
               b0 = random_tensor({5}, gen).to(DType::f32);
  const Tensor dy = random_tensor({4, 5, 3, 3}, gen).to(DType::f32);
  auto run = [&](bool fused) {
    Tensor rm = Tensor::zeros({5}), rv = Tensor::ones({5});
    Variable x(x0.clone(), true), r(r0.clone(), true), w(w0.clone(), true), b(b0.clone(), true);
    Variable y = fused ? F::batch_norm(x, w, b, rm, rv, true, 0.1, kEps, r, true)
                       : F::relu(F::add(F::batch_norm(x, w, b, rm, rv, true, 0.1, kEps), r));
    y.backward(dy);
    return std::vector<Tensor>{y.data(), x.grad(), r.grad(), w.grad(), b.grad(), rm, rv};
  };
  const std::vector<Tensor> fused = run(true), separate = run(false);
  // And without a residual (the ReLU's mask then goes into the batch-norm backward kernels).
  {
    Tensor rm1 = Tensor::zeros({5}), rv1 = Tensor::ones({5}), rm2 = Tensor::zeros({5}),
           rv2 = Tensor::ones({5});
    Variable xa(x0.clone(), true), xb(x0.clone(), true), wa(w0.clone(), true), wb(w0.clone(), true);
    Variable ya = F::batch_norm(xa, wa, Variable(), rm1, rv1, true, 0.1, kEps, Variable(), true);
    Variable yb = F::relu(F::batch_norm(xb, wb, Variable(), rm2, rv2, true, 0.1, kEps));
    ya.backward(dy);
    yb.backward(dy);
    EXPECT_EQ(ya.data().to_vector<float>(), yb.data().to_vector<float>());
    const std::vector<float> ga = xa.grad().to_vector<float>(), gb = xb.grad().to_vector<float>();
    for (size_t j = 0; j < ga.size(); ++j)
      EXPECT_NEAR(ga[j], gb[j], 1e-6f * (1.0f + std::abs(gb[j]))) << "dx";
    const std::vector<float> wga = wa.grad().to_vector<float>(), wgb = wb.grad().to_vector<float>();
    for (size_t j = 0; j < wga.size(); ++j)
      EXPECT_NEAR(wga[j], wgb[j], 1e-6f * (1.0f + std::abs(wgb[j]))) << "dw";
  }
  const char* names[] = {"y", "dx", "dresidual", "dweight", "dbias", "running_mean", "running_var"};
  for (size_t i = 0; i < fused.size(); ++i) {
    const std::vector<float> a = fused[i].to_vector<float>(), e = separate[i].to_vector<float>();
    ASSERT_EQ(a.size(), e.size()) << names[i];
    for (size_t j = 0; j < a.size(); ++j)
      EXPECT_NEAR(a[j], e[j], 1e-6f * (1.0f + std::abs(e[j]))) << names[i];
  }
}

TEST(BatchNorm, GradcheckEval) {
  Generator gen(7);
  Tensor rm = random_tensor({3}, gen), rv = random_tensor({3}, gen, 0.5, 1.5);
  Variable x(random_tensor({2, 3, 2, 2}, gen), true);
  Variable w(random_tensor({3}, gen, 0.5, 1.5), true), b(random_tensor({3}, gen), true);
  EXPECT_GRADCHECK(
      [&](const std::vector<Variable>& in) {
        return F::batch_norm(in[0], in[1], in[2], rm, rv, false, 0.1, kEps);
      },
      {x, w, b});
  Variable x2(random_tensor({2, 3, 2, 2}, gen), true);
  EXPECT_GRADCHECK(
      [&](const std::vector<Variable>& in) {
        return F::batch_norm(in[0], Variable(), Variable(), rm, rv, false, 0.1, kEps);
      },
      {x2});
}

TEST(BatchNorm, EvalUsesRunningStatsAndLeavesThemAlone) {
  Generator gen(8);
  Tensor x = random_tensor({2, 2, 1, 3}, gen);
  Tensor rm = Tensor::from_vector<double>({0.5, -1.0}, {2}),
         rv = Tensor::from_vector<double>({2.0, 0.25}, {2});
  Variable y = F::batch_norm(Variable(x), Variable(), Variable(), rm, rv, false, 0.1, kEps);
  expect_near(y.data().to_vector<double>(), reference_bn(x, {0.5, -1.0}, {2.0, 0.25}, {1, 1}, {0, 0}), 1e-12);
  EXPECT_EQ(rm.to_vector<double>(), (std::vector<double>{0.5, -1.0}));
  EXPECT_EQ(rv.to_vector<double>(), (std::vector<double>{2.0, 0.25}));
}

TEST(BatchNorm, RunningStatsAfterTwoTrainingSteps) {
  // [N=2, C=2, H=1, W=2]: channel 0 holds {1, 2, 3, 4} (mean 2.5, unbiased var 5/3), channel 1
  // {0, 0, 0, 4} (mean 1, unbiased var 4). Step 2 uses 2x + 1: means {6, 3}, unbiased vars {20/3, 16}.
  const std::vector<float> v1{1, 2, 0, 0, 3, 4, 0, 4};
  std::vector<float> v2;
  for (float v : v1) v2.push_back(2 * v + 1);
  for (MemoryFormat format : {MemoryFormat::contiguous, MemoryFormat::channels_last}) {
    Tensor rm = Tensor::zeros({2}), rv = Tensor::ones({2});
    for (const auto& v : {v1, v2}) {
      Tensor x = Tensor::from_vector(v, {2, 2, 1, 2}).contiguous(format);
      F::batch_norm(Variable(x), Variable(), Variable(), rm, rv, true, 0.1, kEps);
    }
    // mean: 0.9 * (0.1 * 2.5) + 0.1 * 6 = 0.825; 0.9 * (0.1 * 1) + 0.1 * 3 = 0.39
    // var: 0.9 * (0.9 + 0.1 * 5/3) + 0.1 * 20/3 = 1.62666..; 0.9 * (0.9 + 0.1 * 4) + 0.1 * 16 = 2.77
    expect_near(rm.to_vector<double>(), {0.825, 0.39}, 1e-6);
    expect_near(rv.to_vector<double>(), {0.81 + 0.15 + 2.0 / 3.0, 2.77}, 1e-6);
  }
}

TEST(BatchNorm, TrainingGradientIsOrthogonalToOnesAndXhat) {
  // With batch statistics (and eps = 0), grad_x sums to zero per channel and is orthogonal to xhat.
  Generator gen(9);
  Tensor rm = Tensor::zeros({2}, DType::f64), rv = Tensor::ones({2}, DType::f64);
  Variable x(random_tensor({4, 2, 3, 1}, gen), true);
  Variable y = F::batch_norm(x, Variable(), Variable(), rm, rv, true, 0.1, 0.0);
  y.backward(random_tensor(y.shape(), gen));
  const std::vector<double> gx = x.grad().to_vector<double>(), yv = y.data().to_vector<double>();
  double s[2] = {0, 0}, d[2] = {0, 0};
  for (size_t i = 0; i < gx.size(); ++i) {
    s[(i / 3) % 2] += gx[i];
    d[(i / 3) % 2] += gx[i] * yv[i];
  }
  for (int c = 0; c < 2; ++c) {
    EXPECT_NEAR(s[c], 0.0, 1e-10);
    EXPECT_NEAR(d[c], 0.0, 1e-10);
  }
}

TEST(BatchNorm, RejectsBadInputs) {
  Tensor rm = Tensor::zeros({2}), rv = Tensor::ones({2});
  Variable x(Tensor::ones({2, 2, 2, 2}));
  EXPECT_THROW(F::batch_norm(x, Variable(Tensor::ones({3})), Variable(), rm, rv, true, 0.1, kEps),
               std::invalid_argument);
  Tensor bad_rm = Tensor::zeros({3});
  EXPECT_THROW(F::batch_norm(x, Variable(), Variable(), bad_rm, rv, true, 0.1, kEps), std::invalid_argument);
  Variable one_per_channel(Tensor::ones({1, 2, 1, 1}));
  EXPECT_THROW(F::batch_norm(one_per_channel, Variable(), Variable(), rm, rv, true, 0.1, kEps),
               std::invalid_argument);
  EXPECT_THROW(F::batch_norm(Variable(Tensor::ones({4})), Variable(), Variable(), rm, rv, true, 0.1, kEps),
               std::invalid_argument);
  EXPECT_THROW(cpu_backend().bn_mean_var(Tensor::ones({2, 2}, DType::i64)), std::invalid_argument);
  Tensor m = Tensor::zeros({2}), s = Tensor::ones({2});
  EXPECT_THROW(cpu_backend().bn_backward_reduce(Tensor::ones({2, 2, 1, 2}), Tensor::ones({2, 2, 2, 2}), m, s,
                                                Tensor()),
               std::invalid_argument);
}

TEST(BatchNorm, WithoutRunningStatsEvalUsesBatchStats) {
  Generator gen(10);
  Tensor x = random_tensor({3, 2, 1, 2}, gen);
  Tensor none_m, none_v;
  Variable y = F::batch_norm(Variable(x), Variable(), Variable(), none_m, none_v, false, 0.1, kEps);
  auto [mean, var] = reference_stats(x);
  expect_near(y.data().to_vector<double>(), reference_bn(x, mean, var, {1, 1}, {0, 0}), 1e-12);
}

}  // namespace
}  // namespace trainer
