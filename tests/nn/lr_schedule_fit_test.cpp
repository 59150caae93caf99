// cut_warmup_to_fit: only a warm-up that leaves the schedule no room of its own is cut; a schedule
// longer than its warm-up is never changed (runs stopped by max_steps keep the full run's curve).
#include <gtest/gtest.h>

#include "nn/optim/lr_schedule.h"

namespace trainer {
namespace {

TEST(LrScheduleFit, AWarmupShorterThanTheScheduleIsKept) {
  ScheduleOptions o{.kind = ScheduleKind::cosine, .total_steps = 1800, .warmup_steps = 100};
  EXPECT_FALSE(cut_warmup_to_fit(o));
  EXPECT_EQ(o.warmup_steps, 100);
}

TEST(LrScheduleFit, AWarmupAsLongAsTheScheduleIsCutToHalfOfIt) {
  // The bench's synthetic runs: one epoch of 25 steps with warmup_epochs = 5 (125 steps).
  ScheduleOptions o{.kind = ScheduleKind::cosine, .total_steps = 25, .warmup_steps = 125};
  EXPECT_TRUE(cut_warmup_to_fit(o));
  EXPECT_EQ(o.warmup_steps, 12);
  EXPECT_NO_THROW(make_lr_schedule(o));
  ScheduleOptions equal{.kind = ScheduleKind::onecycle, .total_steps = 40, .warmup_steps = 40};
  EXPECT_TRUE(cut_warmup_to_fit(equal));
  EXPECT_EQ(equal.warmup_steps, 20);
  EXPECT_NO_THROW(make_lr_schedule(equal));
}

TEST(LrScheduleFit, NoTotalMeansNothingToFit) {
  ScheduleOptions o{.kind = ScheduleKind::constant, .total_steps = 0, .warmup_steps = 10};
  EXPECT_FALSE(cut_warmup_to_fit(o));
  EXPECT_EQ(o.warmup_steps, 10);
}

}  // namespace
}  // namespace trainer
