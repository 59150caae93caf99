// `trainer train` with today's batch recipes on the CPU: Mixup + CutMix + label smoothing (and the BCE
// loss, and repeated augmentation) on configs/fashion_mnist_cnn.toml trains -- its loss falls -- and a
// run stopped mid-epoch resumes bit-exactly, because a step's draws depend on (seed, step) alone.
#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "metrics/run_csv_util.h"
#include "trainer_process.h"

namespace {

namespace fs = std::filesystem;

using trainer::testing::read_csv_columns;
using trainer::testing::read_file;
using trainer::testing::run_trainer;
using trainer::testing::RunResult;

class MixupTrain : public trainer::testing::TrainerRunTest {
 protected:
  MixupTrain() : TrainerRunTest("trainer_mixup_") {}

  // Fashion-MNIST's cnn as shipped, cut to 40 steps at a constant learning rate, with mixing on.
  std::string args(const std::string& run, const std::string& extra = "") {
    return "train " TRAINER_SOURCE_DIR "/configs/fashion_mnist_cnn.toml --set train.run_dir=" + run_dir(run) +
           " --set train.max_steps=40 --set train.log_every_steps=5 --set schedule.name=constant"
           " --set optim.lr=0.05 --set mixup.mixup_alpha=0.8 --set mixup.cutmix_alpha=1.0"
           " --set checkpoint.every_steps=10 --set data.workers=1 " +
           extra;
  }
};

double mean(const std::vector<double>& v, size_t from, size_t to) {
  return std::accumulate(v.begin() + static_cast<long>(from), v.begin() + static_cast<long>(to), 0.0) /
         static_cast<double>(to - from);
}

bool have_fashion_mnist() {
  return fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz");
}

// The loss of the last 10 steps is well below that of the first 10, and the log says how the batch is mixed.
TEST_F(MixupTrain, MixupCutmixAndLabelSmoothingTrain) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
  const RunResult r = run_trainer(args("a"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("loss: cross_entropy on soft targets (label smoothing 0.1); mixup alpha 0.8, "
                          "cutmix alpha 1"),
            std::string::npos)
      << r.output;
  const std::vector<double> loss = read_csv_columns(dir_ / "a/train_steps.csv")["loss"];
  ASSERT_EQ(loss.size(), 40u);
  EXPECT_LT(mean(loss, 30, 40), mean(loss, 0, 10) - 0.4)
      << "first " << mean(loss, 0, 10) << ", last " << mean(loss, 30, 40);
}

// Snapshot + restore equals an uninterrupted run, with mixing, BCE and repeated augmentation on:
// losses and final weights bit-identical.
TEST_F(MixupTrain, ResumeAfterSigtermIsBitExact) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
  // 20 steps (a later --set wins), stopped after 13: the checkpoint of step 10 and 3 steps past it.
  const std::string extra =
      "--set train.max_steps=20 --set train.loss=bce --set data.repeated_augmentations=3";
  ASSERT_EQ(run_trainer(args("full", extra)).exit_code, 0);
  const RunResult killed = run_trainer(args("cut", extra), "TRAINER_TEST_SIGTERM_AT_STEP=13");
  EXPECT_EQ(killed.exit_code, 128 + 15) << killed.output;
  const RunResult resumed = run_trainer(args("cut", extra + " --resume auto"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from"), std::string::npos) << resumed.output;
  EXPECT_EQ(trainer::testing::without_wall_time(read_file(dir_ / "full/train_steps.csv")),
            trainer::testing::without_wall_time(read_file(dir_ / "cut/train_steps.csv")));
  EXPECT_EQ(read_file(dir_ / "full/checkpoints/final.safetensors"),
            read_file(dir_ / "cut/checkpoints/final.safetensors"));
}

// Repeated augmentation on a dataset smaller than DeiT's rounding (floor(n / 256) * 256 per world) would
// deal nothing: refused at start, naming the key.
TEST_F(MixupTrain, RepeatedAugmentationOnATinyDatasetNamesTheKey) {
  const std::string cfg = write_small_config("");
  const RunResult r = run_trainer("train " + cfg +
                                  " --set data.repeated_augmentations=3 --set data.synthetic_samples=200"
                                  " --set train.run_dir=" +
                                  run_dir("tiny"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("data.repeated_augmentations"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("HINT"), std::string::npos) << r.output;
}

}  // namespace
