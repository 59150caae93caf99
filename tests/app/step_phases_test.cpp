// The step-time breakdown accounts for the step: on a real 2-rank CPU run, the six exclusive phases
// (data_wait, h2d, forward, backward, allreduce_exposed, optimizer) add up to the measured step time
// within 5%, i.e. no untimed work hides inside a step. Read from rank 0's step_times.csv, which holds
// the same StepTimes the exporter observes, with the step time measured separately from the phases.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "app/trainer_process.h"
#include "app/trainer_ranks.h"
#include "metrics/step_timer.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

TEST(StepPhases, AddUpToTheStepTimeWithin5PercentOnATwoRankRun) {
  const fs::path dir = fs::temp_directory_path() / ("trainer_step_phases_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path cfg = dir / "cfg.toml";
  std::ofstream(cfg)
      << "[model]\nname = \"cnn\"\nin_channels = 1\n"
         "[data]\ndataset = \"synthetic\"\nsynthetic_samples = 2048\nsynthetic_image_size = 16\n"
         "batch_size = 16\n"
         "[train]\ndevice = \"cpu\"\nepochs = 1\nmax_steps = 40\n"
         "[checkpoint]\nevery_epochs = 0\nsave_final = false\n";
  testing::TrainerRanks ranks(2, {"train", cfg.string(), "--set", "train.run_dir=" + (dir / "run").string()},
                              dir);
  const auto codes = ranks.wait_until(std::chrono::steady_clock::now() + std::chrono::seconds(120));
  ASSERT_EQ(codes[0], 0) << ranks.outputs();
  ASSERT_EQ(codes[1], 0) << ranks.outputs();

  auto csv = trainer::testing::read_csv_columns(dir / "run" / "step_times.csv");
  const std::vector<double>& step = csv["step_seconds"];
  ASSERT_EQ(step.size(), 40u) << "one row per optimizer step";
  double step_total = 0.0, phases_total = 0.0;
  for (std::size_t i = 0; i < step.size(); ++i) {
    double phases = 0.0;
    for (Phase p : kExclusivePhases) {
      const std::vector<double>& column = csv[std::string(phase_name(p)) + "_seconds"];
      ASSERT_EQ(column.size(), step.size()) << phase_name(p);
      EXPECT_GE(column[i], 0.0) << phase_name(p) << " at row " << i;
      phases += column[i];
    }
    // The phases are intervals inside the step on one clock: they never exceed it (beyond rounding),
    // and `other` is what they leave.
    EXPECT_LE(phases, step[i] * (1 + 1e-6) + 1e-9) << "row " << i;
    EXPECT_NEAR(csv["other_seconds"].at(i), std::max(0.0, step[i] - phases), 1e-6 * step[i] + 1e-9);
    // allreduce_total runs from the first bucket's launch (inside backward) to the end of the wait, so
    // it covers the exposed part and lies within the step.
    const double total = csv["allreduce_total_seconds"].at(i),
                 exposed = csv["allreduce_exposed_seconds"].at(i);
    EXPECT_GT(total, 0.0) << "row " << i;
    EXPECT_GE(total * (1 + 1e-6) + 1e-9, exposed) << "row " << i;
    EXPECT_LE(total, step[i] * (1 + 1e-6) + 1e-9) << "row " << i;
    step_total += step[i];
    phases_total += phases;
  }
  ASSERT_GT(step_total, 0.0);
  RecordProperty("phases_share_of_step", std::to_string(phases_total / step_total));
  EXPECT_NEAR(phases_total / step_total, 1.0, 0.05)
      << "phases " << phases_total << " s of " << step_total << " s of steps";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace trainer
