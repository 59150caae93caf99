// The step CSVs agree with the checkpoints after a SIGKILL, and a resume completes them cleanly.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "run_faults.h"

namespace {

namespace fs = std::filesystem;
using namespace trainer::testing;

// ---- 6. the step CSVs agree with the checkpoints after a SIGKILL, and resume cleanly

TEST_F(RunFaults, StepCsvsSurviveSigkillAndResumeWithEveryStepOnce) {
  const std::string cfg = write_config("[checkpoint]\nevery_steps = 4\n");
  const RunResult killed = train(cfg, "k", "TRAINER_TEST_SIGTERM_AT_STEP=10 TRAINER_TEST_SIGNAL=9");
  ASSERT_NE(killed.exit_code, 0) << killed.output;
  ASSERT_TRUE(fs::exists(dir_ / "k/checkpoints/step-00000008")) << killed.output;
  for (const char* csv : {"train_steps.csv", "step_times.csv"}) {
    const std::map<long long, int> rows = step_rows(dir_ / "k" / csv);
    for (long long step = 1; step <= 8; ++step) EXPECT_EQ(rows.count(step), 1u) << csv << " step " << step;
  }
  const RunResult resumed = train(cfg, "k", "", " --resume auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(resumed.output.find("columns differ"), std::string::npos) << resumed.output;
  for (const char* csv : {"train_steps.csv", "step_times.csv"}) {
    const std::map<long long, int> rows = step_rows(dir_ / "k" / csv);
    EXPECT_EQ(rows.size(), 16u) << csv;
    for (long long step = 1; step <= 16; ++step) EXPECT_EQ(rows.count(step) ? rows.at(step) : 0, 1) << step;
  }
}

// A CSV that a kill left empty (its header never reached the disk) is started again with its header.
TEST_F(RunFaults, AnEmptyStepCsvOnResumeGetsItsHeaderBack) {
  const std::string cfg = write_config("[checkpoint]\nevery_steps = 4\n");
  ASSERT_EQ(train(cfg, "e", "TRAINER_TEST_SIGTERM_AT_STEP=6").exit_code, 128 + 15);
  const std::string steps_header = first_line(dir_ / "e/train_steps.csv");
  const std::string times_header = first_line(dir_ / "e/step_times.csv");
  std::ofstream(dir_ / "e/train_steps.csv", std::ios::trunc).close();
  std::ofstream(dir_ / "e/step_times.csv", std::ios::trunc).close();
  const RunResult resumed = train(cfg, "e", "", " --resume auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(resumed.output.find("columns differ"), std::string::npos) << resumed.output;
  EXPECT_EQ(first_line(dir_ / "e/train_steps.csv"), steps_header);
  EXPECT_EQ(first_line(dir_ / "e/step_times.csv"), times_header);
  EXPECT_EQ(step_rows(dir_ / "e/step_times.csv").size(), 10u);  // steps 7..16
}

// A CSV whose header line is lost but whose rows survive gets its header back and keeps its rows
// (instead of being started again as if its columns differed).
TEST_F(RunFaults, AStepCsvWithoutItsHeaderKeepsItsRowsOnResume) {
  const std::string cfg = write_config("[checkpoint]\nevery_steps = 4\n");
  ASSERT_EQ(train(cfg, "h", "TRAINER_TEST_SIGTERM_AT_STEP=6").exit_code, 128 + 15);
  const fs::path csv = dir_ / "h/step_times.csv";
  const std::string header = first_line(csv);
  const std::string text = read_file(csv);
  std::ofstream(csv, std::ios::trunc) << text.substr(text.find('\n') + 1);  // rows 1..6 only
  const RunResult resumed = train(cfg, "h", "", " --resume auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(resumed.output.find("columns differ"), std::string::npos) << resumed.output;
  EXPECT_NE(resumed.output.find("step_times.csv: its header is missing"), std::string::npos)
      << resumed.output;
  EXPECT_EQ(first_line(csv), header);
  const std::map<long long, int> rows = step_rows(csv);
  EXPECT_EQ(rows.size(), 16u);
  for (long long step = 1; step <= 16; ++step) EXPECT_EQ(rows.count(step) ? rows.at(step) : 0, 1) << step;
}

}  // namespace
