// model.freeze and model.freeze_epochs in `trainer train`: frozen parameters keep their initial values
// (checkpoint.save_initial's file) while the others train, they train from the epoch the freeze ends
// with fresh optimizer state, a run resumed inside or after the freeze equals the uninterrupted one bit
// for bit, two ranks equal one with twice the batch across the change, and names that match no
// parameter are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "app/run/freeze.h"
#include "app/tiny_mlp.h"
#include "app/trainer_process.h"
#include "dist/multi_process.h"
#include "metrics/run_csv_util.h"
#include "nn/models/registry.h"
#include "nn/safetensors.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

using testing::read_file;
using testing::run_trainer;
using testing::RunResult;

class FreezeTrain : public testing::TrainerRunTest {
 protected:
  FreezeTrain() : TrainerRunTest("trainer_freeze_") {}

  // The fixture's small run (a cnn: conv1, bn1, conv2, bn2, fc1, fc2; 8 steps per epoch, 2 epochs)
  // with model.freeze = `freeze` (line 4 of the file) and model.freeze_epochs = `epochs`, writing its
  // initial weights and a checkpoint per epoch; `checkpoint_lines` go into [checkpoint].
  std::string write_config(const std::string& freeze, int epochs, const std::string& checkpoint_lines = "") {
    const fs::path path = dir_ / "freeze.toml";
    std::ofstream(path)
        << "[model]\nname = \"cnn\"\nin_channels = 1\nfreeze = " << freeze << "\nfreeze_epochs = " << epochs
        << "\n[data]\ndataset = \"synthetic\"\nsynthetic_samples = 256\n"
           "synthetic_image_size = 12\nbatch_size = 32\nrandom_crop_padding = 2\nhflip = true\n"
           "[train]\nepochs = 2\nlog_every_steps = 4\n"
           "[checkpoint]\nsave_initial = true\nevery_epochs = 1\n"
        << checkpoint_lines;
    return path.string();
  }

  static std::map<std::string, Tensor> weights(const fs::path& path) {
    return load_safetensors(path.string());
  }

  // Per tensor of `a`: whether `b`'s tensor of that name is bit-identical.
  static std::map<std::string, bool> same(const std::map<std::string, Tensor>& a,
                                          const std::map<std::string, Tensor>& b) {
    std::map<std::string, bool> equal;
    for (const auto& [name, t] : a) equal[name] = t.to_vector<float>() == b.at(name).to_vector<float>();
    return equal;
  }
};

TEST_F(FreezeTrain, FrozenParametersKeepTheirInitialValuesWhileTheOthersTrain) {
  const std::string cfg = write_config("[\"conv1\", \"bn1\", \"fc1\"]", 0);
  RunResult run = run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("run"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("freeze: 6 parameter tensors"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("for the whole run"), std::string::npos) << run.output;
  const auto initial = weights(dir_ / "run/checkpoints/initial.safetensors");
  const auto equal = same(initial, weights(dir_ / "run/checkpoints/final.safetensors"));
  for (const char* frozen :
       {"conv1.weight", "conv1.bias", "bn1.weight", "bn1.bias", "fc1.weight", "fc1.bias"})
    EXPECT_TRUE(equal.at(frozen)) << frozen << " changed";
  for (const char* trained : {"conv2.weight", "bn2.weight", "fc2.weight", "fc2.bias"})
    EXPECT_FALSE(equal.at(trained)) << trained << " did not train";
  // BatchNorm keeps training mode in a frozen layer: its running statistics follow the batches.
  EXPECT_FALSE(equal.at("bn1.running_mean"));
}

TEST_F(FreezeTrain, TheFreezeEndsAtItsEpochWithFreshOptimizerState) {
  const std::string cfg = write_config("[\"backbone\"]", 1);
  RunResult run = run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("run"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("for epoch 1; 2 tensors"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("freeze: ends at epoch 2"), std::string::npos) << run.output;
  const auto initial = weights(dir_ / "run/checkpoints/initial.safetensors");
  // The checkpoint at the end of epoch 1 (step 8): only the head (fc2) has trained, and the optimizer
  // holds no state for the rest (step 0 and zeros: torch.optim's missing entry).
  const fs::path epoch_one = dir_ / "run/checkpoints/step-00000008";
  const auto after_one = same(initial, weights(epoch_one / "model.safetensors"));
  EXPECT_TRUE(after_one.at("conv1.weight"));
  EXPECT_TRUE(after_one.at("fc1.weight"));
  EXPECT_FALSE(after_one.at("fc2.weight"));
  const auto optimizer = weights(epoch_one / "optimizer.safetensors");
  EXPECT_EQ(optimizer.at("step.conv1.weight").item(), 0.0);
  EXPECT_EQ(optimizer.at("step.fc2.weight").item(), 8.0);
  for (float v : optimizer.at("momentum_buffer.fc1.weight").to_vector<float>()) ASSERT_EQ(v, 0.0f);
  // Epoch 2 trains everything.
  const auto after_two = same(initial, weights(dir_ / "run/checkpoints/final.safetensors"));
  EXPECT_FALSE(after_two.at("conv1.weight"));
  EXPECT_FALSE(after_two.at("fc1.weight"));
}

// Snapshot + restore equals an uninterrupted run: a SIGTERM inside the freeze (step 5) and one after it
// (step 11), each resumed with --resume auto; losses and final weights bit-identical.
TEST_F(FreezeTrain, ResumeInsideAndAfterTheFreezeIsBitExact) {
  const std::string cfg = write_config("[\"conv1\", \"conv2\"]", 1, "every_steps = 3\n");
  RunResult full = run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("full"));
  ASSERT_EQ(full.exit_code, 0) << full.output;
  for (const int kill_at : {5, 11}) {
    const std::string cut = "cut" + std::to_string(kill_at);
    RunResult killed = run_trainer("train " + cfg + " --set train.run_dir=" + run_dir(cut),
                                   "TRAINER_TEST_SIGTERM_AT_STEP=" + std::to_string(kill_at));
    EXPECT_EQ(killed.exit_code, 128 + 15) << killed.output;
    RunResult resumed =
        run_trainer("train " + cfg + " --set train.run_dir=" + run_dir(cut) + " --resume auto");
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find(kill_at < 8 ? "frozen by model.freeze" : "ended before epoch 2"),
              std::string::npos)
        << resumed.output;
    EXPECT_EQ(testing::without_wall_time(read_file(dir_ / "full/train_steps.csv")),
              testing::without_wall_time(read_file(dir_ / cut / "train_steps.csv")))
        << kill_at;
    EXPECT_EQ(read_file(dir_ / "full/checkpoints/final.safetensors"),
              read_file(dir_ / cut / "checkpoints/final.safetensors"))
        << kill_at;
  }
}

// Two ranks equal one rank with twice the batch while the set of trained parameters changes: the
// reducer's buckets leave the frozen parameters out, then take them in (an mlp: no BatchNorm).
TEST_F(FreezeTrain, TwoRanksEqualOneRankAcrossTheEndOfTheFreeze) {
  const fs::path cfg = dir_ / "mlp.toml";
  std::ofstream(cfg)
      << "[model]\nname = \"mlp\"\nin_channels = 1\nfreeze = [\"fc1\"]\nfreeze_epochs = 1\n"
         "[data]\ndataset = \"synthetic\"\nsynthetic_samples = 256\nsynthetic_image_size = 12\n"
         "[train]\nepochs = 2\n[optim]\nlr = 0.05\n[checkpoint]\nevery_epochs = 0\n";
  const int port = testing::free_port();
  const auto one = testing::run_ranks(
      dir_, port,
      {"train " + cfg.string() + " --set data.batch_size=64 --set train.run_dir=" + run_dir("one")});
  ASSERT_EQ(one[0].exit_code, 0) << one[0].output;
  const std::string two_args =
      "train " + cfg.string() + " --set data.batch_size=32 --set train.run_dir=" + run_dir("two");
  const auto two = testing::run_ranks(dir_, port, {two_args, two_args});
  ASSERT_EQ(two[0].exit_code, 0) << two[0].output << two[1].output;
  ASSERT_EQ(two[1].exit_code, 0) << two[1].output;
  EXPECT_NE(two[0].output.find("freeze: ends at epoch 2"), std::string::npos) << two[0].output;
  const auto a = weights(dir_ / "one/checkpoints/final.safetensors");
  const auto b = weights(dir_ / "two/checkpoints/final.safetensors");
  for (const auto& [name, t] : a) {
    const auto x = t.to_vector<double>(), y = b.at(name).to_vector<double>();
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
    EXPECT_LT(worst, 1e-5) << name;
  }
}

// The error names the file, line and column of model.freeze, and the model's groups.
TEST_F(FreezeTrain, ANameMatchingNoParameterIsAConfigErrorListingTheGroups) {
  const std::string cfg = write_config("[\"conv\"]", 0);
  RunResult run = run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("run"));
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find(cfg + ":4:10: model.freeze: \"conv\" names no parameter of model 'cnn'"),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("conv1, bn1, conv2, bn2, fc1, fc2"), std::string::npos) << run.output;
}

// Run in-process: the prefixes against resnet18's names, and the errors' positions in the file.
TEST(FrozenParameters, PrefixesEndAtADotAndBackboneIsAllButTheHead) {
  ModelOptions o;
  o.name = "resnet18";
  o.num_classes = 10;
  const auto model = create_model(o);
  Config config = load_config("", {"model.name=resnet18", "model.freeze=[\"layer1\", \"bn1\"]"});
  const FrozenParameters some(config, *model, classifier_prefix("resnet18"));
  EXPECT_EQ(some.tensors(), 2 + 12);  // bn1's weight and bias; layer1's two blocks of 6, not layer10's
  config = load_config("", {"model.name=resnet18", "model.freeze=[\"backbone\"]"});
  const FrozenParameters backbone(config, *model, classifier_prefix("resnet18"));
  EXPECT_EQ(backbone.tensors(), static_cast<int64_t>(model->named_parameters().size()) - 2);
  EXPECT_TRUE(backbone.frozen_in(0));
  EXPECT_TRUE(backbone.frozen_in(99));  // freeze_epochs 0: the whole run
  backbone.set_frozen(true);
  for (const NamedParameter& p : model->named_parameters())
    EXPECT_EQ(p.param.requires_grad(), p.name.starts_with("fc.")) << p.name;
  backbone.set_frozen(false);
  for (const NamedParameter& p : model->named_parameters()) EXPECT_TRUE(p.param.requires_grad()) << p.name;
}

TEST(FrozenParameters, FreezingEverythingAndEmptyOrShardedFreezesAreRefused) {
  const auto model = testing::tiny_mlp();
  const Config all = load_config("", {"model.name=mlp", "model.freeze=[\"fc1\", \"fc2\", \"fc3\"]"});
  try {
    FrozenParameters(all, *model, classifier_prefix("mlp"));
    ADD_FAILURE() << "a freeze of every parameter was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("nothing would train"), std::string::npos) << e.what();
  }
  const auto refused = [](const std::vector<std::string>& overrides, const std::string& key) {
    try {
      load_config("", overrides);
      ADD_FAILURE() << "accepted: " << overrides.back();
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(key + ": "), std::string::npos) << e.what();
    }
  };
  refused({"model.freeze_epochs=2"}, "model.freeze_epochs");
  refused({"model.freeze=[\"backbone\"]", "dist.zero_stage=1"}, "dist.zero_stage");
  refused({"model.freeze=\"backbone\""}, "model.freeze");  // an array, not a string
}

}  // namespace
}  // namespace trainer
