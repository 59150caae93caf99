// checkpoint.save_initial: a fresh run writes the weights its first step starts from -- here
// model.pretrained's, with the classifier re-initialised for the run's class count -- and a resumed run
// writes none.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "app/trainer_process.h"
#include "nn/models/registry.h"
#include "nn/safetensors.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

class InitialWeights : public testing::TrainerRunTest {
 protected:
  InitialWeights() : TrainerRunTest("trainer_initial_") {}
};

TEST_F(InitialWeights, AFreshRunWritesThePretrainedWeightsWithItsOwnHead) {
  ModelOptions o;
  o.name = "cnn";
  o.in_channels = 1;
  o.image_size = 12;
  o.num_classes = 100;  // the synthetic data has 10
  o.seed = 5;
  const std::string pretrained = (dir_ / "cnn_100.safetensors").string();
  save_module(pretrained, *create_model(o));
  const std::string cfg = write_small_config("[train]\nepochs = 1\n[checkpoint]\nsave_initial = true\n");
  const std::string args = "train " + cfg + " --set model.pretrained=" + pretrained +
                           " --set train.max_steps=3 --set train.run_dir=" + run_dir("run");
  testing::RunResult run = testing::run_trainer(args);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const fs::path initial = dir_ / "run/checkpoints/initial.safetensors";
  EXPECT_NE(run.output.find("initial weights: " + initial.string()), std::string::npos) << run.output;
  const std::map<std::string, Tensor> start = load_safetensors(initial.string());
  const std::map<std::string, Tensor> file = load_safetensors(pretrained);
  EXPECT_EQ(start.at("conv1.weight").to_vector<float>(), file.at("conv1.weight").to_vector<float>());
  EXPECT_EQ(start.at("fc1.weight").to_vector<float>(), file.at("fc1.weight").to_vector<float>());
  EXPECT_EQ(start.at("fc2.weight").shape(), (Shape{10, 128}));
  // The final weights have trained away from them.
  EXPECT_NE(load_safetensors((dir_ / "run/checkpoints/final.safetensors").string())
                .at("conv1.weight")
                .to_vector<float>(),
            start.at("conv1.weight").to_vector<float>());
  // A resumed run starts from its checkpoint, not from these weights: it leaves the file alone.
  fs::remove(initial);
  run = testing::run_trainer(args + " --set train.max_steps=5 --resume auto");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_FALSE(fs::exists(initial));
}

}  // namespace
}  // namespace trainer
