// A run limited by train.max_steps follows the LR curve of the full run (the schedule spans
// train.epochs), so a max_steps shorter than the warm-up is no error; only a warm-up longer than the
// whole schedule is cut, and both are named in the experiment's notes for the log.
#include <gtest/gtest.h>

#include <string>

#include "app/config/config.h"
#include "app/run/experiment.h"

namespace trainer {
namespace {

// Synthetic 8x8 images, 256 of them in batches of 32: 8 optimizer steps per epoch.
Config small_config(std::vector<std::string> sets) {
  std::vector<std::string> all = {"model.name=mlp",
                                  "data.dataset=synthetic",
                                  "data.synthetic_samples=256",
                                  "data.synthetic_image_size=8",
                                  "data.batch_size=32",
                                  "schedule.name=cosine"};
  all.insert(all.end(), sets.begin(), sets.end());
  return load_config("", all);
}

bool mentions(const std::vector<std::string>& notes, const std::string& text) {
  for (const std::string& n : notes)
    if (n.find(text) != std::string::npos) return true;
  return false;
}

Experiment on_cpu(const Config& config) { return build_experiment(config, cpu_run_device(config), true); }

TEST(ShortRunSchedule, MaxStepsBelowTheWarmupFollowsTheFullRunsCurve) {
  // 10 epochs x 8 steps, warm-up 2 epochs = 16 steps; the run stops after 5.
  const Experiment full = on_cpu(small_config({"train.epochs=10", "schedule.warmup_epochs=2"}));
  const Experiment short_run =
      on_cpu(small_config({"train.epochs=10", "schedule.warmup_epochs=2", "train.max_steps=5"}));
  EXPECT_EQ(short_run.total_steps, 5);
  EXPECT_EQ(short_run.schedule_steps, 80);
  EXPECT_EQ(short_run.warmup_steps, 16);
  for (int64_t step = 0; step < 5; ++step)
    EXPECT_EQ(short_run.schedule->factor(step), full.schedule->factor(step)) << "step " << step;
  EXPECT_TRUE(
      mentions(short_run.schedule_notes, "train.max_steps = 5 stops the run at step 5 of the 80-step"));
  EXPECT_TRUE(full.schedule_notes.empty());
}

TEST(ShortRunSchedule, AWarmupLongerThanTheWholeScheduleIsCutWithANote) {
  // 1 epoch of 8 steps, warm-up 5 epochs = 40 steps: the whole schedule is shorter than the warm-up.
  const Experiment e = on_cpu(small_config({"train.epochs=1", "schedule.warmup_epochs=5"}));
  EXPECT_EQ(e.warmup_steps, 4);
  EXPECT_TRUE(mentions(e.schedule_notes, "warm-up cut to 4 steps"));
  EXPECT_DOUBLE_EQ(e.schedule->factor(4), 1.0);  // the warm-up ends where the cosine starts
}

}  // namespace
}  // namespace trainer
