#include "nn/amp/loss_scaler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "nn/functional.h"
#include "nn/modules/module.h"
#include "nn/optim/sgd.h"

namespace trainer {
namespace {

LossScalerOptions small_interval() {
  LossScalerOptions o;
  o.init_scale = 1024;
  o.growth_interval = 3;
  return o;
}

TEST(LossScaler, GrowsAfterIntervalOfCleanStepsAndBacksOffOnInf) {
  LossScaler s(small_interval());
  EXPECT_EQ(s.scale(), 1024);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.growth_tracker(), 2);
  s.update(false);
  EXPECT_EQ(s.scale(), 2048);
  EXPECT_EQ(s.growth_tracker(), 0);
  s.update(false);
  s.update(true);  // back-off resets the growth tracker
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.growth_tracker(), 0);
  EXPECT_EQ(s.skipped_steps(), 1);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 1024);  // only 2 clean steps since the reset
  s.update(false);
  EXPECT_EQ(s.scale(), 2048);
}

TEST(LossScaler, DefaultsAreGradScalers) {
  LossScaler s;
  EXPECT_EQ(s.scale(), 65536.0);
  for (int i = 0; i < 1999; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 65536.0);
  s.update(false);
  EXPECT_EQ(s.scale(), 131072.0);
}

TEST(LossScaler, DisabledIsIdentity) {
  LossScalerOptions o;
  o.enabled = false;
  LossScaler s(o);
  Variable x(Tensor::from_vector<float>({2}, {1}), true);
  Variable l = s.scale_loss(F::mul(x, 3.0));
  EXPECT_EQ(l.item(), 6.0);
  s.update(true);
  EXPECT_EQ(s.scale(), 1.0);
}

// Scale, backward, unscale: the gradients equal the unscaled ones, also over accumulated micro-batches.
TEST(LossScaler, UnscaledGradientsEqualPlainOnesWithAccumulation) {
  LossScaler s(small_interval());
  Variable w(Tensor::from_vector<float>({0.5f, -1.0f}, {2}), true);
  Variable plain(Tensor::from_vector<float>({0.5f, -1.0f}, {2}), true);
  for (double x : {1.0, 3.0}) {  // two micro-batches, each loss / 2
    s.scale_loss(F::mul(F::sum(F::mul(w, x)), 0.5)).backward();
    F::mul(F::sum(F::mul(plain, x)), 0.5).backward();
  }
  EXPECT_TRUE(s.unscale_and_check({w}));
  EXPECT_EQ(w.grad().to_vector<float>(), plain.grad().to_vector<float>());
}

// An inf in one gradient skips the step: weights and optimizer state untouched, scale halved; and the
// verdict is combined across ranks through `agree`.
TEST(LossScaler, InjectedInfSkipsTheStepAndLeavesStateUntouched) {
  LossScaler s(small_interval());
  Variable a(Tensor::from_vector<float>({1, 2}, {2}), true), b(Tensor::from_vector<float>({3}, {1}), true);
  SgdOptions so;
  so.lr = 0.1;
  so.momentum = 0.9;
  Sgd opt({{"a", a}, {"b", b}}, so);
  // One clean step so the momentum buffers exist.
  a.grad() = Tensor::from_vector<float>({1024, 1024}, {2});
  b.grad() = Tensor::from_vector<float>({1024}, {1});
  ASSERT_TRUE(s.unscale_and_check({a, b}));
  opt.step();
  s.update(false);
  const auto a_before = a.data().to_vector<float>(), b_before = b.data().to_vector<float>();
  const auto state_before = opt.state_tensors();
  a.grad() = Tensor::from_vector<float>({1, std::numeric_limits<float>::infinity()}, {2});
  b.grad() = Tensor::from_vector<float>({1}, {1});
  const bool finite = s.unscale_and_check({a, b});
  EXPECT_FALSE(finite);
  if (finite) opt.step();
  s.update(!finite);
  EXPECT_EQ(s.scale(), 512);
  EXPECT_EQ(a.data().to_vector<float>(), a_before);
  EXPECT_EQ(b.data().to_vector<float>(), b_before);
  const auto state_after = opt.state_tensors();
  for (size_t i = 0; i < state_after.size(); ++i)
    EXPECT_EQ(state_after[i].second.to_vector<double>(), state_before[i].second.to_vector<double>());
  // A NaN on another rank skips the step here too.
  a.grad() = Tensor::from_vector<float>({1, 1}, {2});
  EXPECT_FALSE(s.unscale_and_check({a}, [](bool local) { return local && false; }));
}

TEST(LossScaler, RejectsBadOptionsAndState) {
  LossScalerOptions o;
  o.backoff_factor = 1.5;
  EXPECT_THROW(LossScaler{o}, std::invalid_argument);
  LossScaler s;
  EXPECT_THROW(s.load_state(-1, 0), std::invalid_argument);
  s.load_state(128, 7);
  EXPECT_EQ(s.scale(), 128);
  EXPECT_EQ(s.growth_tracker(), 7);
}

}  // namespace
}  // namespace trainer
