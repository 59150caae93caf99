// A diverged run is named as such, with what to change: `trainer train` warns when its final accuracy
// is at chance after the warm-up, and `trainer bench --to-accuracy` reports a point whose loss became
// NaN as diverged (not a failed bench, not just "not reached").
#include "app/train/divergence.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "trainer_process.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;
using testing::read_file;
using testing::run_trainer;
using testing::RunResult;

TEST(Divergence, ChanceIsAGuessersAccuracyWithinItsSamplingNoise) {
  EXPECT_TRUE(accuracy_at_chance(0.10, 10, 10000));
  EXPECT_TRUE(accuracy_at_chance(0.115, 10, 10000));
  EXPECT_FALSE(accuracy_at_chance(0.13, 10, 10000));
  EXPECT_TRUE(accuracy_at_chance(0.17, 10, 100));  // 100 images: a guesser reaches 19% by luck
  EXPECT_TRUE(accuracy_at_chance(0.51, 2, 10000));
  EXPECT_FALSE(accuracy_at_chance(0.70, 2, 10000));  // a two-class model that learned (was "diverged")
  EXPECT_FALSE(accuracy_at_chance(0.0, 1, 100));     // one class: nothing to guess
}

TEST(Divergence, HintNamesTheLinearlyScaledLr) {
  EXPECT_EQ(divergence_hint(true, 1024, 0.8),
            "LR too high for the global batch of 1024 (linear scaling gave 0.8); lengthen the warm-up "
            "(schedule.warmup_epochs) or lower optim.lr");
  EXPECT_NE(divergence_hint(false, 128, 0.1).find("(optim.lr 0.1)"), std::string::npos);
}

class DivergedRun : public testing::TrainerRunTest {
 protected:
  DivergedRun() : TrainerRunTest("trainer_diverged_") {}
};

TEST_F(DivergedRun, TrainWarnsWhenTheFinalAccuracyIsAtChance) {
  // An LR too small to move the weights: the final top-1 stays where a random model's is.
  const std::string cfg = write_small_config("[train]\nepochs = 2\n[optim]\nlr = 1e-9\n");
  const RunResult r = run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("chance"));
  ASSERT_EQ(r.exit_code, 0) << r.output;  // the run and its outputs are complete
  EXPECT_NE(r.output.find("warning: the final test top-1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("is at chance (10 classes) after 16 steps, past the 0-step warm-up"),
            std::string::npos)
      << r.output;
  EXPECT_NE(
      r.output.find("HINT: LR too high for the global batch of 32 (optim.lr 1e-09); lengthen the warm-up"),
      std::string::npos)
      << r.output;
  EXPECT_NE(read_file(dir_ / "chance" / "train.log").find("is at chance"), std::string::npos);
}

TEST_F(DivergedRun, NoChanceWarningWhileStillWarmingUp) {
  const std::string cfg =
      write_small_config("[train]\nepochs = 2\n[optim]\nlr = 1e-9\n[schedule]\nwarmup_epochs = 1.5\n");
  const RunResult r =
      run_trainer("train " + cfg + " --set train.max_steps=4 --set train.run_dir=" + run_dir("warm"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("is at chance"), std::string::npos) << r.output;
}

TEST_F(DivergedRun, BenchToAccuracyNamesANanLossAsDivergence) {
  const fs::path out = dir_ / "tta";
  const std::string cfg = write_small_config("[train]\nepochs = 2\n");
  const RunResult r =
      run_trainer("bench " + cfg + " --procs 1 --to-accuracy 0.9 --set optim.lr=1e12 --out " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("diverged: loss is"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("HINT: LR too high for the global batch of 32 (linear scaling gave 2.5e+11)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("note: speedup.png leaves out 1 process, batch 32/rank, fp32: diverged"),
            std::string::npos)
      << r.output;
  const std::string csv = read_file(out / "bench.csv");
  EXPECT_NE(csv.find(",repeats,diverged\n"), std::string::npos) << csv;
  EXPECT_NE(csv.find(",1,true\n"), std::string::npos) << csv;
  const nlohmann::json point = nlohmann::json::parse(read_file(out / "bench.json")).at("points").at(0);
  EXPECT_EQ(point.at("diverged"), true) << point;
  EXPECT_EQ(point.at("divergence").at(0).get<std::string>().rfind("loss is", 0), 0u) << point;
}

TEST_F(DivergedRun, BenchToAccuracyNamesAnAccuracyAtChanceAsDivergence) {
  const fs::path out = dir_ / "tta";
  const std::string cfg = write_small_config("[train]\nepochs = 2\n");
  const RunResult r =
      run_trainer("bench " + cfg + " --procs 1 --to-accuracy 0.99 --set optim.lr=1e-9 --out " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("not reached: best"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("diverged, test top-1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("is at chance after the warm-up. HINT: LR too high"), std::string::npos)
      << r.output;
  EXPECT_NE(read_file(out / "bench.csv").find(",1,true\n"), std::string::npos);
}

}  // namespace
}  // namespace trainer
