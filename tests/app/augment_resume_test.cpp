// [augment] end to end: the augmentations reach the training loader, and a run stopped mid-epoch and
// resumed sees the same augmented images as an uninterrupted one (bit-identical losses and weights).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "metrics/run_csv_util.h"
#include "trainer_process.h"

namespace {

namespace fs = std::filesystem;

using trainer::testing::read_file;
using trainer::testing::run_trainer;
using trainer::testing::RunResult;

class AugmentRun : public trainer::testing::TrainerRunTest {
 protected:
  AugmentRun() : TrainerRunTest("trainer_augment_") {}

  std::string write_config(const std::string& augment) {
    return write_small_config(
        "[train]\nepochs = 2\nlog_every_steps = 1\n[optim]\nlr = 0.05\n"
        "[checkpoint]\nevery_steps = 5\n" +
        augment);
  }
};

const char* kEveryAugmentation =
    "[augment]\npolicy = \"randaugment\"\ncolor_jitter = [0.4, 0.4, 0.0, 0.0]\nrandom_erasing = 0.5\n"
    "erasing_value = \"random\"\n";

TEST_F(AugmentRun, ResumedRunSeesTheSameImages) {
  const std::string cfg = write_config(kEveryAugmentation);
  ASSERT_EQ(run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("full")).exit_code, 0);
  RunResult killed = run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("cut"),
                                 "TRAINER_TEST_SIGTERM_AT_STEP=11");
  ASSERT_EQ(killed.exit_code, 128 + 15) << killed.output;
  RunResult resumed =
      run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("cut") + " --resume auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from"), std::string::npos) << resumed.output;
  EXPECT_EQ(trainer::testing::without_wall_time(read_file(dir_ / "full/train_steps.csv")),
            trainer::testing::without_wall_time(read_file(dir_ / "cut/train_steps.csv")));
  EXPECT_EQ(read_file(dir_ / "full/checkpoints/final.safetensors"),
            read_file(dir_ / "cut/checkpoints/final.safetensors"));
}

TEST_F(AugmentRun, AugmentationChangesTheTrainingImages) {
  const std::string plain = write_config("");
  ASSERT_EQ(run_trainer("train " + plain + " --set train.run_dir=" + run_dir("plain")).exit_code, 0);
  const std::string augmented = write_config(kEveryAugmentation);
  ASSERT_EQ(run_trainer("train " + augmented + " --set train.run_dir=" + run_dir("augmented")).exit_code, 0);
  EXPECT_NE(trainer::testing::without_wall_time(read_file(dir_ / "plain/train_steps.csv")),
            trainer::testing::without_wall_time(read_file(dir_ / "augmented/train_steps.csv")));
}

}  // namespace
