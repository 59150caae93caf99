#include <gtest/gtest.h>

#include "gradcheck.h"
#include "nn/backend.h"
#include "nn/functional.h"

namespace trainer {
namespace {

using testing::random_tensor;

TEST(Autograd, GradientsAccumulateAcrossBackwardCalls) {
  Variable x(Tensor::from_vector<double>({1, 2, 3}, {3}), true);
  F::sum(F::mul(x, x)).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2, 4, 6}));
  F::sum(F::mul(x, 3.0)).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{5, 7, 9}));
  x.zero_grad();
  EXPECT_FALSE(x.grad().defined());
}

TEST(Autograd, SharedSubexpressionGetsSummedGradient) {
  Variable x(Tensor::from_vector<double>({2}, {1}), true);
  Variable y = F::mul(x, 3.0);
  Variable z = F::add(F::mul(y, y), y);  // 9x^2 + 3x -> 18x + 3
  F::sum(z).backward();
  EXPECT_DOUBLE_EQ(x.grad().item(), 39.0);
}

TEST(Autograd, NoGradRecordsNothing) {
  Variable x(Tensor::ones({2}, DType::f64), true);
  NoGradGuard guard;
  Variable y = F::mul(x, 2.0);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(y.is_leaf());
}

TEST(Autograd, GradReadyHookFiresOncePerLeafAfterAllContributions) {
  Variable w(Tensor::from_vector<double>({1, 2}, {2}), true);
  Variable b(Tensor::from_vector<double>({5}, {1}), true);
  std::vector<std::string> fired;
  std::vector<double> seen;
  w.add_grad_ready_hook([&](Variable& v) {
    fired.push_back("w");
    seen = v.grad().to_vector<double>();
  });
  b.add_grad_ready_hook([&](Variable&) { fired.push_back("b"); });
  // w is used twice; its hook must fire only once, with the full gradient.
  Variable y = F::add(F::mul(w, w), F::mul(w, b));
  F::sum(y).backward();
  EXPECT_EQ(std::count(fired.begin(), fired.end(), "w"), 1);
  EXPECT_EQ(std::count(fired.begin(), fired.end(), "b"), 1);
  EXPECT_EQ(seen, (std::vector<double>{2 * 1 + 5, 2 * 2 + 5}));
}

TEST(Autograd, GraphIsFreedAfterBackward) {
  Variable x(Tensor::ones({2}, DType::f64), true);
  Variable y = F::sum(F::mul(x, x));
  y.backward();
  EXPECT_THROW(y.backward(), std::logic_error);
}

TEST(Autograd, BackwardNeedsScalarOrSeed) {
  Variable x(Tensor::ones({2}, DType::f64), true);
  Variable y = F::mul(x, 2.0);
  EXPECT_THROW(y.backward(), std::invalid_argument);
  y.backward(Tensor::from_vector<double>({1, 10}, {2}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2, 20}));
}

// A leaf's gradient keeps the layout the backward gave it: a channels-last gradient is taken as it is
// when nothing else holds it, and copied channels-last when something does (a contiguous copy made the
// optimizer convert every channels-last weight gradient back, two strided copies per weight per step).
TEST(Autograd, ALeafGradientKeepsItsChannelsLastLayout) {
  const Tensor value = Tensor::ones({4, 3, 3, 3}).contiguous(MemoryFormat::channels_last);
  for (bool shared : {false, true}) {
    Variable w(value.clone(MemoryFormat::channels_last), true);
    const Tensor g = Tensor::full({4, 3, 3, 3}, 2.0).contiguous(MemoryFormat::channels_last);
    Tensor held;  // a second owner of the gradient's storage, in the shared case
    Variable y =
        record_op("channels_last_grad", w.data(), {w}, [&, shared](const Tensor&) -> std::vector<Tensor> {
          Tensor out = g.clone(MemoryFormat::channels_last);
          if (shared) held = out;
          return {out};
        });
    y.backward(Tensor::ones({4, 3, 3, 3}));
    EXPECT_TRUE(w.grad().is_contiguous(MemoryFormat::channels_last)) << "shared " << shared;
    EXPECT_EQ(w.grad().to_vector<float>(), g.to_vector<float>());
    if (shared) EXPECT_NE(w.grad().storage(), held.storage());  // copied: the op's tensor may change
  }
}

// A node with backward_of_two gets two parts unadded; a third part is added to them in arrival order
// and the node's plain backward runs; one part runs the plain backward too.
TEST(Autograd, BackwardOfTwoGetsTwoPartsAndThreeAreAdded) {
  for (int consumers = 1; consumers <= 3; ++consumers) {
    Variable x(Tensor::from_vector<double>({1, 2}, {2}), true);
    std::vector<std::vector<double>> seen_plain, seen_two;
    Variable y = record_op("identity", x.data(), {x}, [&](const Tensor& g) -> std::vector<Tensor> {
      seen_plain.push_back(g.to_vector<double>());
      return {g};
    });
    set_backward_of_two(y, [&](const Tensor& a, const Tensor& b) -> std::vector<Tensor> {
      seen_two.push_back(a.to_vector<double>());
      seen_two.push_back(b.to_vector<double>());
      return {backend_for(a).binary(BinaryOp::add, a, b)};
    });
    Variable total = F::mul(y, 1.0);
    for (int c = 1; c < consumers; ++c) total = F::add(total, F::mul(y, static_cast<double>(10 * c)));
    F::sum(total).backward();
    const double expected = 1.0 + (consumers > 1 ? 10.0 : 0.0) + (consumers > 2 ? 20.0 : 0.0);
    EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{expected, expected})) << consumers;
    EXPECT_EQ(seen_two.size(), consumers == 2 ? 2u : 0u) << consumers;
    EXPECT_EQ(seen_plain.size(), consumers == 2 ? 0u : 1u) << consumers;
  }
}

// An op with two outputs (u = 2x, v = 3x) runs its backward once, after every consumer of either output,
// with one gradient per output; an output nothing consumed arrives undefined; backward() from the second
// output seeds that output.
TEST(Autograd, AMultiOutputNodeRunsOnceWithEachOutputsGradient) {
  for (int mode = 0; mode < 3; ++mode) {  // 0: both outputs used, 1: only v, 2: backward() on v itself
    Variable x(Tensor::from_vector<double>({1, 2}, {2}), true);
    int runs = 0;
    bool u_defined = false;
    std::vector<Variable> uv = record_op_multi(
        "two_outputs", {F::mul(x, 2.0).data(), F::mul(x, 3.0).data()}, {x},
        [&](const std::vector<Tensor>& g) -> std::vector<Tensor> {
          ++runs;
          EXPECT_EQ(g.size(), 2u);
          u_defined = g[0].defined();
          Tensor dx = backend_for(g[1]).binary_scalar(BinaryOp::mul, g[1], 3.0, false);
          if (g[0].defined())
            dx = backend_for(dx).binary(BinaryOp::add, dx,
                                        backend_for(g[0]).binary_scalar(BinaryOp::mul, g[0], 2.0, false));
          return {dx};
        });
    ASSERT_EQ(uv.size(), 2u);
    EXPECT_TRUE(uv[0].grad_fn() == uv[1].grad_fn());
    if (mode == 0) {
      // u feeds two consumers and v one, recorded in between, so the node waits for all three.
      Variable total = F::add(F::mul(uv[0], 5.0), F::mul(uv[1], 7.0));
      total = F::add(total, F::mul(uv[0], 11.0));
      F::sum(total).backward();
      EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{53, 53}));  // 2 * 16 + 3 * 7
    } else if (mode == 1) {
      F::sum(F::mul(uv[1], 7.0)).backward();
      EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{21, 21}));
    } else {
      uv[1].backward(Tensor::from_vector<double>({1, 10}, {2}));
      EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{3, 30}));
    }
    EXPECT_EQ(runs, 1) << mode;
    EXPECT_EQ(u_defined, mode == 0) << mode;
  }
}

TEST(Autograd, AMultiOutputOpWithoutGradRecordsNothing) {
  Variable x(Tensor::from_vector<double>({1}, {1}), false);
  const std::vector<Variable> uv =
      record_op_multi("two_outputs", {x.data(), x.data()}, {x},
                      [](const std::vector<Tensor>&) { return std::vector<Tensor>{}; });
  ASSERT_EQ(uv.size(), 2u);
  EXPECT_FALSE(uv[0].requires_grad());
  EXPECT_FALSE(uv[1].requires_grad());
}

// ---- finite-difference checks of the elementwise, reduction, shape and matmul ops

Variable leaf(const Shape& s, Generator& g, double lo = -1, double hi = 1) {
  return Variable(random_tensor(s, g, lo, hi), true);
}

TEST(Gradcheck, BinaryOpsWithBroadcasting) {
  Generator g(1);
  using Fn = Variable (*)(const Variable&, const Variable&);
  for (Fn op : {static_cast<Fn>(F::add), static_cast<Fn>(F::sub), static_cast<Fn>(F::mul)}) {
    EXPECT_GRADCHECK([op](auto& in) { return op(in[0], in[1]); }, {leaf({2, 3, 4}, g), leaf({3, 1}, g)});
    EXPECT_GRADCHECK([op](auto& in) { return op(in[0], in[1]); }, {leaf({1, 4}, g), leaf({3, 1}, g)});
  }
  EXPECT_GRADCHECK([](auto& in) { return F::div(in[0], in[1]); }, {leaf({2, 3}, g), leaf({3}, g, 0.5, 2.0)});
}

TEST(Gradcheck, ScalarForms) {
  Generator g(2);
  EXPECT_GRADCHECK([](auto& in) { return F::add(in[0], 1.5); }, {leaf({5}, g)});
  EXPECT_GRADCHECK([](auto& in) { return F::sub(in[0], 1.5); }, {leaf({5}, g)});
  EXPECT_GRADCHECK([](auto& in) { return F::rsub(2.0, in[0]); }, {leaf({5}, g)});
  EXPECT_GRADCHECK([](auto& in) { return F::mul(in[0], -3.0); }, {leaf({5}, g)});
  EXPECT_GRADCHECK([](auto& in) { return F::div(in[0], 4.0); }, {leaf({5}, g)});
  EXPECT_GRADCHECK([](auto& in) { return F::rdiv(2.0, in[0]); }, {leaf({5}, g, 0.5, 2.0)});
}

TEST(Gradcheck, UnaryOps) {
  Generator g(3);
  EXPECT_GRADCHECK([](auto& in) { return F::neg(in[0]); }, {leaf({4, 3}, g)});
  EXPECT_GRADCHECK([](auto& in) { return F::sigmoid(in[0]); }, {leaf({4, 3}, g, -3, 3)});
  EXPECT_GRADCHECK([](auto& in) { return F::exp(in[0]); }, {leaf({4, 3}, g)});
  EXPECT_GRADCHECK([](auto& in) { return F::log(in[0]); }, {leaf({4, 3}, g, 0.5, 3)});
  EXPECT_GRADCHECK([](auto& in) { return F::sqrt(in[0]); }, {leaf({4, 3}, g, 0.5, 3)});
  EXPECT_GRADCHECK([](auto& in) { return F::square(in[0]); }, {leaf({4, 3}, g)});
  // relu: keep inputs away from the kink where finite differences are undefined.
  Tensor x = random_tensor({4, 3}, g, 0.1, 1.0);
  double* p = x.data<double>();
  for (int i = 0; i < 12; i += 2) p[i] = -p[i];
  EXPECT_GRADCHECK([](auto& in) { return F::relu(in[0]); }, {Variable(x, true)});
}

TEST(Gradcheck, Reductions) {
  Generator g(4);
  EXPECT_GRADCHECK([](auto& in) { return F::sum(in[0]); }, {leaf({3, 4, 2}, g)});
  EXPECT_GRADCHECK([](auto& in) { return F::sum(in[0], {0, 2}); }, {leaf({3, 4, 2}, g)});
  EXPECT_GRADCHECK([](auto& in) { return F::mean(in[0], {1}, true); }, {leaf({3, 4, 2}, g)});
  EXPECT_GRADCHECK([](auto& in) { return F::mean(in[0], {-1}); }, {leaf({3, 4, 2}, g)});
}

TEST(Gradcheck, ShapeOps) {
  Generator g(5);
  EXPECT_GRADCHECK([](auto& in) { return F::reshape(in[0], {4, -1}); }, {leaf({2, 3, 4}, g)});
  EXPECT_GRADCHECK([](auto& in) { return F::flatten(in[0]); }, {leaf({2, 3, 2, 2}, g)});
  EXPECT_GRADCHECK([](auto& in) { return F::mul(F::permute(in[0], {2, 0, 1}), 2.0); }, {leaf({2, 3, 4}, g)});
  EXPECT_GRADCHECK([](auto& in) { return F::contiguous(in[0], MemoryFormat::channels_last); },
                   {leaf({2, 3, 2, 2}, g)});
}

TEST(Gradcheck, MatmulAndLinear) {
  Generator g(6);
  EXPECT_GRADCHECK([](auto& in) { return F::matmul(in[0], in[1]); }, {leaf({3, 4}, g), leaf({4, 5}, g)});
  EXPECT_GRADCHECK([](auto& in) { return F::linear(in[0], in[1], in[2]); },
                   {leaf({3, 4}, g), leaf({5, 4}, g), leaf({5}, g)});
  EXPECT_GRADCHECK([](auto& in) { return F::linear(in[0], in[1], Variable()); },
                   {leaf({3, 4}, g), leaf({2, 4}, g)});
}

}  // namespace
}  // namespace trainer
