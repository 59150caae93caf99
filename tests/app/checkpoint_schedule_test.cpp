// Which checkpoints `trainer train` writes: checkpoint.every_steps falling on an epoch's last step while
// checkpoint.every_epochs is due there writes one checkpoint (the epoch's, after its evaluation), not two
// of the same weights; the run's last step leaves it to the final one; a resume from it is bit-exact.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "app/run/checkpoint.h"
#include "run_outputs.h"
#include "trainer_process.h"

namespace {

namespace fs = std::filesystem;
using trainer::testing::read_file;
using trainer::testing::RunResult;

class CheckpointSchedule : public trainer::testing::TrainerRunTest {
 protected:
  CheckpointSchedule() : TrainerRunTest("trainer_ckpt_schedule_") {}

  // 2 epochs of 8 steps; a step checkpoint every 4 steps, so steps 8 and 16 end epochs.
  std::string write_config(const std::string& checkpoint_keys) {
    return write_small_config("[train]\nepochs = 2\nlog_every_steps = 4\n[optim]\nlr = 0.05\n[checkpoint]\n" +
                              checkpoint_keys);
  }
  RunResult train(const std::string& cfg, const std::string& run, const std::string& env = "",
                  const std::string& more = "") {
    return trainer::testing::run_trainer("train " + cfg + " --set train.run_dir=" + run_dir(run) + more, env);
  }
  // The paths of train.log's "checkpoint: PATH" lines, one per checkpoint written, in order.
  std::vector<std::string> checkpoints_written(const std::string& run) {
    std::vector<std::string> paths;
    std::istringstream log(read_file(dir_ / run / "train.log"));
    const std::string mark = "checkpoint: ";
    for (std::string line; std::getline(log, line);)
      if (const size_t at = line.find(mark); at != std::string::npos)
        paths.push_back(line.substr(at + mark.size()));
    return paths;
  }
  std::string step_dir(const std::string& run, int step) {
    char name[32];
    std::snprintf(name, sizeof name, "step-%08d", step);
    return (dir_ / run / "checkpoints" / name).string();
  }
};

// every_steps = 4 with every_epochs = 1: steps 4, 8 (epoch 1's end, once), 12, and the final one at 16;
// step 8's checkpoint is the epoch's: it resumes at epoch 2's first batch and carries the evaluation.
TEST_F(CheckpointSchedule, AStepCheckpointAtAnEpochsEndIsWrittenOnceAsTheEpochs) {
  const RunResult r = train(write_config("every_steps = 4\nevery_epochs = 1\nkeep_last = 5\n"), "a");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<std::string> written = checkpoints_written("a");
  const std::vector<std::string> expected = {step_dir("a", 4), step_dir("a", 8), step_dir("a", 12),
                                             step_dir("a", 16)};
  EXPECT_EQ(written, expected) << read_file(dir_ / "a/train.log");
  const trainer::TrainingState at_8 = trainer::verify_checkpoint(step_dir("a", 8));
  EXPECT_EQ(at_8.epoch, 1);
  EXPECT_EQ(at_8.batch_in_epoch, 0);
  EXPECT_GE(at_8.accuracy, 0.0) << "the epoch's checkpoint carries its evaluation";
}

// every_epochs = 2 is not due after epoch 1: step 8's checkpoint is a step checkpoint (resuming inside
// epoch 1, after its last batch), and epoch 2's end is the run's end, left to the final checkpoint.
TEST_F(CheckpointSchedule, AStepCheckpointAtAnEpochsEndStaysWhenNoEpochCheckpointIsDue) {
  const RunResult r = train(write_config("every_steps = 4\nevery_epochs = 2\nkeep_last = 5\n"), "b");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<std::string> written = checkpoints_written("b");
  ASSERT_EQ(written.size(), 4u) << read_file(dir_ / "b/train.log");
  EXPECT_EQ(std::set<std::string>(written.begin(), written.end()).size(), 4u)
      << "no checkpoint written twice";
  const trainer::TrainingState at_8 = trainer::verify_checkpoint(step_dir("b", 8));
  EXPECT_EQ(at_8.epoch, 0);
  EXPECT_EQ(at_8.batch_in_epoch, 8);
}

// A run stopped at step 10 without an at-signal checkpoint resumes from step 8's (the epoch's) and ends
// bit-identical to an uninterrupted run: losses, epoch rows and final weights.
TEST_F(CheckpointSchedule, ResumeFromTheEpochsCheckpointIsBitExact) {
  const std::string cfg = write_config("every_steps = 4\nevery_epochs = 1\non_signal = false\n");
  ASSERT_EQ(train(cfg, "full").exit_code, 0);
  const RunResult stopped = train(cfg, "cut", "TRAINER_TEST_SIGTERM_AT_STEP=10");
  ASSERT_EQ(stopped.exit_code, 128 + 15) << stopped.output;
  const RunResult resumed = train(cfg, "cut", "", " --resume auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from " + step_dir("cut", 8)), std::string::npos) << resumed.output;
  trainer::testing::expect_same_run(dir_ / "full", dir_ / "cut");
}

}  // namespace
