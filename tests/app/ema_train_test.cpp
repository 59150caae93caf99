// The weight average (ema.*) and the layer-wise optimizers in `trainer train`: the average is
// evaluated beside the model (log, metrics.csv, summary.json), saved in checkpoints and resumed
// exactly; keep_best can rank it; the config refuses combinations that cannot work.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "metrics/run_csv_util.h"
#include "trainer_process.h"

namespace {

namespace fs = std::filesystem;

using trainer::testing::read_file;
using trainer::testing::run_trainer;
using trainer::testing::RunResult;

class EmaTrain : public trainer::testing::TrainerRunTest {
 protected:
  EmaTrain() : TrainerRunTest("trainer_ema_") {}

  // Two epochs of 8 steps; the average with its warm-up, updated every second step.
  std::string write_config(const std::string& optim, const std::string& extra = "") {
    return write_small_config("[train]\nepochs = 2\nlog_every_steps = 4\n[optim]\n" + optim +
                              "[ema]\nenabled = true\ndecay = 0.99\nwarmup = true\nevery_steps = 2\n" +
                              extra);
  }

  // The newest step-* directory of a run's checkpoints.
  fs::path newest_checkpoint(const std::string& run) {
    fs::path newest;
    for (const auto& d : fs::directory_iterator(dir_ / run / "checkpoints"))
      if (d.path().filename().string().starts_with("step-") && d.path() > newest) newest = d.path();
    return newest;
  }
};

// Snapshot + restore equals an uninterrupted run with the average on: a SIGTERM at step 11 (between
// two of its updates), --resume auto, and the losses, metrics.csv (the average's columns too), the
// final weights and the final average are bit-identical.
TEST_F(EmaTrain, ResumeWithTheAverageIsBitExact) {
  const std::string cfg = write_config("lr = 0.05\n",
                                       "[checkpoint]\nevery_steps = 5\nkeep_best = 1\n"
                                       "keep_best_on = \"ema\"\n");
  RunResult full = run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("full"));
  ASSERT_EQ(full.exit_code, 0) << full.output;
  EXPECT_NE(full.output.find("| EMA test loss"), std::string::npos) << full.output;
  RunResult killed = run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("cut"),
                                 "TRAINER_TEST_SIGTERM_AT_STEP=11");
  EXPECT_EQ(killed.exit_code, 128 + 15) << killed.output;
  RunResult resumed =
      run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("cut") + " --resume auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(trainer::testing::without_wall_time(read_file(dir_ / "full/train_steps.csv")),
            trainer::testing::without_wall_time(read_file(dir_ / "cut/train_steps.csv")));
  const std::string metrics = trainer::testing::without_timing_columns(read_file(dir_ / "full/metrics.csv"));
  EXPECT_EQ(metrics, trainer::testing::without_timing_columns(read_file(dir_ / "cut/metrics.csv")));
  EXPECT_NE(metrics.find("ema_eval_loss,ema_eval_top1,ema_eval_top5"), std::string::npos) << metrics;
  EXPECT_EQ(metrics.find(",,,\n2,"), std::string::npos) << "an evaluated epoch has the average's cells";
  EXPECT_EQ(read_file(dir_ / "full/checkpoints/final.safetensors"),
            read_file(dir_ / "cut/checkpoints/final.safetensors"));
  const fs::path full_last = newest_checkpoint("full"), cut_last = newest_checkpoint("cut");
  ASSERT_FALSE(full_last.empty());
  EXPECT_EQ(full_last.filename(), cut_last.filename());
  EXPECT_EQ(read_file(full_last / "ema.safetensors"), read_file(cut_last / "ema.safetensors"));
  // The average differs from the weights it follows (decay > 0), and the summary reports it apart.
  EXPECT_NE(read_file(full_last / "ema.safetensors"), read_file(full_last / "model.safetensors"));
  const std::string summary = read_file(dir_ / "full/summary.json");
  EXPECT_NE(summary.find("\"final_ema_test_accuracy\""), std::string::npos) << summary;
  EXPECT_NE(summary.find("\"best_ema_test_accuracy\""), std::string::npos) << summary;
  EXPECT_NE(read_file(full_last / "checkpoint.toml").find("[ema]"), std::string::npos);
}

// LAMB and LARS with layer-wise LR decay train end to end (losses finite, an evaluation at the end).
TEST_F(EmaTrain, LambAndLarsWithLayerDecayTrain) {
  for (const std::string optim :
       {"name = \"lamb\"\nlr = 0.01\nweight_decay = 0.02\nlayer_decay = 0.75\n",
        "name = \"lars\"\nlr = 0.5\nweight_decay = 1e-4\ntrust_coeff = 0.02\nlayer_decay = 0.8\n"}) {
    const std::string cfg = write_config(optim);
    RunResult run = run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("opt"));
    ASSERT_EQ(run.exit_code, 0) << optim << run.output;
    EXPECT_NE(run.output.find("| EMA test loss"), std::string::npos) << run.output;
    fs::remove_all(dir_ / "opt");
  }
}

// Combinations that cannot work are refused at load time, naming the key.
TEST_F(EmaTrain, ConfigRefusesLambWithZeroAndEmaRankingWithoutAverage) {
  const std::string lamb = write_small_config("[optim]\nname = \"lamb\"\n[dist]\nzero_stage = 1\n");
  try {
    trainer::load_config(lamb);
    ADD_FAILURE() << "lamb with ZeRO loaded";
  } catch (const trainer::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("dist.zero_stage"), std::string::npos) << e.what();
  }
  const std::string best = write_small_config("[checkpoint]\nkeep_best_on = \"ema\"\n");
  try {
    trainer::load_config(best);
    ADD_FAILURE() << "keep_best_on = ema without an average loaded";
  } catch (const trainer::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint.keep_best_on"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("ema.enabled"), std::string::npos) << e.what();
  }
}

}  // namespace
