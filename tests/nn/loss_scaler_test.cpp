#include "nn/amp/loss_scaler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>

#include "nn/functional.h"
#include "nn/modules/module.h"
#include "nn/optim/adamw.h"
#include "nn/optim/sgd.h"

namespace trainer {
namespace {

LossScalerOptions small_interval() {
  LossScalerOptions o;
  o.init_scale = 1024;
  o.rule.growth_interval = 3;
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
  o.rule.backoff_factor = 1.5;
  EXPECT_THROW(LossScaler{o}, std::invalid_argument);
  LossScaler s;
  EXPECT_THROW(s.load_state(-1, 0), std::invalid_argument);
  s.load_state(128, 7);
  EXPECT_EQ(s.scale(), 128);
  EXPECT_EQ(s.growth_tracker(), 7);
}

// ---- kept on the device (here the CPU backend, which implements the same kernels as the GPU's).

// The device scaler follows the host scaler's rule step for step: growth after growth_interval clean
// steps, back-off and a skipped step on inf, the tracker reset by either.
TEST(LossScalerOnDevice, FollowsTheHostRuleStepForStep) {
  LossScaler host(small_interval()), device(small_interval());
  device.keep_on_device(Device::cpu());
  const bool pattern[] = {false, false, false, true, false, false, true, true, false, false, false, false};
  for (bool inf : pattern) {
    Variable w(Tensor::from_vector<float>({1.0f, inf ? std::numeric_limits<float>::infinity() : 2.0f}, {2}),
               true);
    w.grad() = w.data().clone();
    Variable wh(w.data().clone(), true);
    wh.grad() = w.data().clone();
    device.unscale_on_device({w});
    const bool finite = host.unscale_and_check({wh});
    EXPECT_EQ(*device.found_inf_flag() != 0, !finite);
    host.update(!finite);
    device.update_on_device();
    EXPECT_EQ(*device.found_inf_flag(), 0);  // cleared for the next step
    EXPECT_EQ(device.scale(), host.scale());
    EXPECT_EQ(device.growth_tracker(), host.growth_tracker());
    EXPECT_EQ(device.skipped_steps(), host.skipped_steps());
    if (finite) EXPECT_EQ(w.grad().to_vector<float>(), wh.grad().to_vector<float>());
  }
  EXPECT_EQ(device.skipped_steps(), 3);
  EXPECT_EQ(device.scale(), 512);  // 1024 -> 2048 -> 1024 -> 512 -> 256 -> 512
}

// The scaled loss reads the device scale (a constant operand): its gradient is scale times the plain one.
TEST(LossScalerOnDevice, ScalesTheLossByTheDeviceValueAndLoadsState) {
  LossScaler s(small_interval());
  s.keep_on_device(Device::cpu());
  s.load_state(256, 2);  // a resumed run: the device copy takes the checkpoint's values
  EXPECT_EQ(s.scale(), 256);
  EXPECT_EQ(s.growth_tracker(), 2);
  Variable w(Tensor::from_vector<float>({0.5f, -1.0f}, {2}), true);
  s.scale_loss(F::sum(F::mul(w, 3.0))).backward();
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{768, 768}));
  s.update_on_device();  // a third clean step: grows
  EXPECT_EQ(s.scale(), 512);
  EXPECT_THROW(s.update(false), std::logic_error);  // the host rule is not used any more
}

// SGD skipping on the flag leaves weights and momentum untouched, and (dampening 0) the step after a
// skipped first step equals a first step: what torch.optim.SGD does when GradScaler skips on the host.
TEST(LossScalerOnDevice, SgdSkipsOnTheFlagExactlyAsAHostSkip) {
  SgdOptions so;
  so.lr = 0.1;
  so.momentum = 0.9;
  so.nesterov = true;
  so.weight_decay = 0.01;
  Variable a(Tensor::from_vector<float>({1, 2, 3}, {3}), true),
      ref(Tensor::from_vector<float>({1, 2, 3}, {3}), true);
  Sgd opt({{"a", a}}, so), ref_opt({{"a", ref}}, so);
  ASSERT_TRUE(opt.skips_exactly_on_device());
  LossScaler s(small_interval());
  s.keep_on_device(Device::cpu());
  opt.skip_if(s.found_inf_flag());
  // Step 1: an inf gradient, skipped on the flag.
  a.grad() = Tensor::from_vector<float>({1, std::numeric_limits<float>::infinity(), 1}, {3});
  s.unscale_on_device({a});
  opt.step();
  s.update_on_device();
  EXPECT_EQ(a.data().to_vector<float>(), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(opt.state_tensors()[0].second.to_vector<float>(), (std::vector<float>{0, 0, 0}));
  // Step 2 (scale now 512): equals the reference's first step.
  for (int step = 0; step < 2; ++step) {
    const std::vector<float> g = {0.25f * (step + 1), -0.5f, 0.75f};
    a.grad() = F::mul(Variable(Tensor::from_vector<float>(g, {3})), s.scale()).data();
    s.unscale_on_device({a});
    opt.step();
    s.update_on_device();
    ref.grad() = Tensor::from_vector<float>(g, {3});
    ref_opt.step();
    EXPECT_EQ(a.data().to_vector<float>(), ref.data().to_vector<float>()) << step;
    EXPECT_EQ(opt.state_tensors()[0].second.to_vector<float>(),
              ref_opt.state_tensors()[0].second.to_vector<float>());
  }
}

// AdamW skipping on the flag is what torch.optim.AdamW does when GradScaler skips on the host (its
// step() is not called): weights, moments and the bias correction's count move only on applied steps.
// Parameter b has no gradient in some steps (its count must not move then either). The checkpoint's
// "step.<param>" entries are the applied counts, and a resumed optimizer continues the same way.
TEST(LossScalerOnDevice, AdamWSkipsOnTheFlagExactlyAsAHostSkip) {
  AdamWOptions ao;
  ao.lr = 0.01;
  ao.weight_decay = 0.1;
  auto param = [](std::vector<float> v) { return Variable(Tensor::from_vector<float>(v, {2}), true); };
  Variable a = param({1, -2}), b = param({0.5f, 3}), ref_a = param({1, -2}), ref_b = param({0.5f, 3});
  AdamW opt({{"a", a}, {"b", b}}, ao), ref({{"a", ref_a}, {"b", ref_b}}, ao);
  ASSERT_TRUE(opt.skips_exactly_on_device());
  LossScaler s(small_interval());
  s.keep_on_device(Device::cpu());
  opt.skip_if(s.found_inf_flag());
  const float inf = std::numeric_limits<float>::infinity();
  struct Step {
    bool finite, b_has_grad;
  };
  // Skipped first steps (fp16's usual start), a skip between applied steps, b left out twice.
  const std::vector<Step> steps = {{false, true}, {true, true}, {false, true}, {false, false},
                                   {true, false}, {true, true}, {true, true},  {false, true}};
  auto run = [&](AdamW& o, Variable& x, Variable& y, AdamW& r, Variable& rx, Variable& ry, size_t i) {
    const Step& st = steps[i];
    const float k = 0.1f * static_cast<float>(i + 1);
    x.grad() = F::mul(Variable(Tensor::from_vector<float>({k, st.finite ? -k : inf}, {2})), s.scale()).data();
    y.grad() = st.b_has_grad ? F::mul(Variable(Tensor::from_vector<float>({2 * k, k}, {2})), s.scale()).data()
                             : Tensor();
    s.unscale_on_device(st.b_has_grad ? std::vector<Variable>{x, y} : std::vector<Variable>{x});
    o.step();
    s.update_on_device();
    if (!st.finite) return;
    rx.grad() = Tensor::from_vector<float>({k, -k}, {2});
    ry.grad() = st.b_has_grad ? Tensor::from_vector<float>({2 * k, k}, {2}) : Tensor();
    r.step();
  };
  auto expect_same = [](const AdamW& o, const AdamW& r, const std::string& where) {
    const auto got = o.state_tensors(), want = r.state_tensors();
    ASSERT_EQ(got.size(), want.size());
    for (size_t j = 0; j < got.size(); ++j) {
      EXPECT_EQ(got[j].first, want[j].first);
      EXPECT_EQ(got[j].second.to_vector<double>(), want[j].second.to_vector<double>())
          << where << ": " << got[j].first;
    }
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    run(opt, a, b, ref, ref_a, ref_b, i);
    EXPECT_EQ(a.data().to_vector<float>(), ref_a.data().to_vector<float>()) << "step " << i + 1;
    EXPECT_EQ(b.data().to_vector<float>(), ref_b.data().to_vector<float>()) << "step " << i + 1;
    expect_same(opt, ref, "step " + std::to_string(i + 1));
  }
  EXPECT_EQ(opt.step_count(), 8);  // step() calls, skipped ones included
  const auto state = opt.state_tensors();
  const std::map<std::string, Tensor> by_name(state.begin(), state.end());
  EXPECT_EQ(by_name.at("step.a").item(), 4);  // applied: steps 2, 5, 6, 7
  EXPECT_EQ(by_name.at("step.b").item(), 3);  // applied with a gradient: steps 2, 6, 7
  // A resumed optimizer (its counts loaded, then skipping on the flag) continues as the reference does.
  Variable a2 = param({0, 0}), b2 = param({0, 0});
  AdamW resumed({{"a", a2}, {"b", b2}}, ao);
  resumed.load_state(opt.state_tensors(), opt.step_count());
  resumed.skip_if(s.found_inf_flag());
  a2.data().copy_(a.data());
  b2.data().copy_(b.data());
  for (size_t i : {1, 0, 5}) {  // applied, skipped, applied
    run(resumed, a2, b2, ref, ref_a, ref_b, i);
    EXPECT_EQ(a2.data().to_vector<float>(), ref_a.data().to_vector<float>()) << "resumed, step " << i + 1;
    expect_same(resumed, ref, "resumed, step " + std::to_string(i + 1));
  }
}

TEST(LossScalerOnDevice, ADisabledScalerCannotMoveToTheDevice) {
  LossScaler disabled(LossScalerOptions{.enabled = false});
  EXPECT_THROW(disabled.keep_on_device(Device::cpu()), std::logic_error);
}

}  // namespace
}  // namespace trainer
