// LR schedules against closed-form values at chosen steps: warmup start and end, decay boundaries,
// mid-cosine, the final step, and OneCycleLR's phases.
#include "nn/optim/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <stdexcept>
#include <string>

namespace trainer {
namespace {

constexpr double kPi = std::numbers::pi;

double factor(const ScheduleOptions& o, int64_t step) { return make_lr_schedule(o)->factor(step); }

TEST(LrSchedule, ConstantWithLinearWarmup) {
  const ScheduleOptions plain{.kind = ScheduleKind::constant};
  EXPECT_EQ(factor(plain, 0), 1.0);
  EXPECT_EQ(factor(plain, 12345), 1.0);
  const ScheduleOptions o{.kind = ScheduleKind::constant, .warmup_steps = 10, .warmup_start_factor = 0.1};
  EXPECT_DOUBLE_EQ(factor(o, 0), 0.1);              // warmup start
  EXPECT_DOUBLE_EQ(factor(o, 5), 0.1 + 0.9 * 0.5);  // halfway
  EXPECT_DOUBLE_EQ(factor(o, 9), 0.1 + 0.9 * 0.9);  // last warmup step
  EXPECT_DOUBLE_EQ(factor(o, 10), 1.0);             // end of warmup
  EXPECT_DOUBLE_EQ(factor(o, 1000), 1.0);
  EXPECT_EQ(make_lr_schedule(o)->name(), "constant");
}

TEST(LrSchedule, StepDecaysEveryStepEpochs) {
  const ScheduleOptions o{.kind = ScheduleKind::step,
                          .steps_per_epoch = 10,
                          .warmup_steps = 5,
                          .warmup_start_factor = 0.2,
                          .step_epochs = 3,
                          .gamma = 0.1};
  EXPECT_DOUBLE_EQ(factor(o, 0), 0.2);
  EXPECT_DOUBLE_EQ(factor(o, 4), 0.2 + 0.8 * 4.0 / 5.0);
  EXPECT_DOUBLE_EQ(factor(o, 5), 1.0);
  EXPECT_DOUBLE_EQ(factor(o, 29), 1.0);  // last step of epoch 2
  EXPECT_DOUBLE_EQ(factor(o, 30), 0.1);  // epoch 3: first decay
  EXPECT_DOUBLE_EQ(factor(o, 59), 0.1);
  EXPECT_DOUBLE_EQ(factor(o, 60), 0.01);  // epoch 6
  EXPECT_DOUBLE_EQ(factor(o, 95), 0.001);
}

TEST(LrSchedule, MultiStepDecaysAtMilestoneEpochs) {
  const ScheduleOptions o{
      .kind = ScheduleKind::multistep, .steps_per_epoch = 10, .milestones = {2, 5}, .gamma = 0.5};
  EXPECT_DOUBLE_EQ(factor(o, 0), 1.0);
  EXPECT_DOUBLE_EQ(factor(o, 19), 1.0);
  EXPECT_DOUBLE_EQ(factor(o, 20), 0.5);  // epoch 2
  EXPECT_DOUBLE_EQ(factor(o, 49), 0.5);
  EXPECT_DOUBLE_EQ(factor(o, 50), 0.25);  // epoch 5
  EXPECT_DOUBLE_EQ(factor(o, 10000), 0.25);
  // Warmup multiplies the decayed factor.
  ScheduleOptions w = o;
  w.warmup_steps = 4;
  w.warmup_start_factor = 0.0;
  EXPECT_DOUBLE_EQ(factor(w, 0), 0.0);
  EXPECT_DOUBLE_EQ(factor(w, 2), 0.5);
  EXPECT_DOUBLE_EQ(factor(w, 4), 1.0);
}

TEST(LrSchedule, CosineAfterWarmup) {
  const ScheduleOptions o{.kind = ScheduleKind::cosine,
                          .total_steps = 110,
                          .warmup_steps = 10,
                          .warmup_start_factor = 0.0,
                          .min_lr_factor = 0.1};
  auto cosine = [](double t) { return 0.1 + 0.9 * (1.0 + std::cos(kPi * t / 100.0)) / 2.0; };
  EXPECT_DOUBLE_EQ(factor(o, 0), 0.0);  // warmup start
  EXPECT_DOUBLE_EQ(factor(o, 5), 0.5);
  EXPECT_DOUBLE_EQ(factor(o, 10), 1.0);  // end of warmup = start of cosine
  EXPECT_DOUBLE_EQ(factor(o, 35), 0.1 + 0.9 * (1.0 + std::sqrt(0.5)) / 2.0);  // t = T/4
  EXPECT_DOUBLE_EQ(factor(o, 60), 0.55);                                      // mid cosine: t = T/2
  EXPECT_DOUBLE_EQ(factor(o, 109), cosine(99));                               // final step
  EXPECT_DOUBLE_EQ(factor(o, 110), 0.1);  // min reached after the final step (T_cur = T_max)
  EXPECT_DOUBLE_EQ(factor(o, 500), 0.1);
  const ScheduleOptions no_warmup{.kind = ScheduleKind::cosine, .total_steps = 4};
  EXPECT_DOUBLE_EQ(factor(no_warmup, 0), 1.0);
  EXPECT_DOUBLE_EQ(factor(no_warmup, 2), 0.5);
  EXPECT_DOUBLE_EQ(factor(no_warmup, 3), (1.0 + std::cos(kPi * 0.75)) / 2.0);
}

// torch OneCycleLR, anneal cos, relative to max_lr: initial 1/25, final 1/25/1e4.
double cos_anneal(double start, double end, double pct) {
  return end + (start - end) / 2.0 * (std::cos(kPi * pct) + 1.0);
}

TEST(LrSchedule, OneCycleMatchesTorchFormula) {
  const double initial = 1.0 / 25.0, final = initial / 1e4;
  // pct_start 0.25 of 100 steps: the rise ends at step 24 (torch: 0.25 * 100 - 1), the fall at 99.
  const ScheduleOptions o{.kind = ScheduleKind::onecycle, .total_steps = 100};
  EXPECT_NEAR(factor(o, 0), initial, 1e-15);  // torch gets 0.04000000000000004 too
  EXPECT_DOUBLE_EQ(factor(o, 12), 0.52);      // halfway up: (0.04 + 1) / 2
  EXPECT_DOUBLE_EQ(factor(o, 24), 1.0);       // peak
  EXPECT_DOUBLE_EQ(factor(o, 25), cos_anneal(1.0, final, 1.0 / 75.0));
  EXPECT_DOUBLE_EQ(factor(o, 61), cos_anneal(1.0, final, 37.0 / 75.0));
  EXPECT_NEAR(factor(o, 99), 4e-6, 1e-18);  // final step
  EXPECT_NEAR(factor(o, 150), 4e-6, 1e-18);

  // warmup_steps replaces pct_start; the linear warmup is not stacked on top.
  const ScheduleOptions w{
      .kind = ScheduleKind::onecycle, .total_steps = 50, .warmup_steps = 10, .warmup_start_factor = 0.5};
  EXPECT_NEAR(factor(w, 0), initial, 1e-15);
  EXPECT_DOUBLE_EQ(factor(w, 3), cos_anneal(initial, 1.0, 3.0 / 9.0));
  EXPECT_DOUBLE_EQ(factor(w, 9), 1.0);
  EXPECT_DOUBLE_EQ(factor(w, 10), cos_anneal(1.0, final, 1.0 / 40.0));
  EXPECT_NEAR(factor(w, 49), final, 1e-18);
}

TEST(LrSchedule, RejectsInconsistentOptions) {
  EXPECT_THROW(make_lr_schedule({.kind = ScheduleKind::step, .steps_per_epoch = 0}), std::invalid_argument);
  EXPECT_THROW(make_lr_schedule({.kind = ScheduleKind::step, .steps_per_epoch = 10, .step_epochs = 0}),
               std::invalid_argument);
  EXPECT_THROW(
      make_lr_schedule({.kind = ScheduleKind::multistep, .steps_per_epoch = 10, .milestones = {5, 3}}),
      std::invalid_argument);
  EXPECT_THROW(make_lr_schedule({.kind = ScheduleKind::cosine, .total_steps = 10, .warmup_steps = 10}),
               std::invalid_argument);
  EXPECT_THROW(make_lr_schedule({.kind = ScheduleKind::onecycle, .total_steps = 4}), std::invalid_argument);
  EXPECT_THROW(make_lr_schedule({.kind = ScheduleKind::onecycle, .total_steps = 10, .warmup_steps = 10}),
               std::invalid_argument);
  EXPECT_THROW(
      make_lr_schedule({.kind = ScheduleKind::constant, .warmup_steps = 5, .warmup_start_factor = 1.5}),
      std::invalid_argument);
  EXPECT_THROW(make_lr_schedule({.kind = ScheduleKind::constant})->factor(-1), std::invalid_argument);
}

}  // namespace
}  // namespace trainer
