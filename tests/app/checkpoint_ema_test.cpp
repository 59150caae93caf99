// Checkpoints with the weight average (ema.enabled): ema.safetensors and its counts round-trip, a
// damaged average is named like any tensor, a checkpoint without one restarts the average from the
// loaded weights, and keep_best_on = "ema" ranks checkpoints by the average's accuracy.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "app/run/checkpoint.h"
#include "nn/optim/sgd.h"
#include "tiny_mlp.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

class CheckpointEma : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("trainer_ckpt_ema_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    model_ = testing::tiny_mlp();
    opt_ = std::make_unique<Sgd>(model_->named_parameters(), SgdOptions{});
    EmaOptions o;
    o.decay = 0.5;
    ema_ = std::make_unique<ModelEma>(*model_, o);
    for (int i = 0; i < 3; ++i) {  // three updates of weights that move
      for (auto& p : model_->parameters()) p.data().fill_(0.25 * (i + 1));
      ema_->after_optimizer_step(false, nullptr);
    }
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string save(int64_t step, double ema_accuracy, KeepBestOn on = KeepBestOn::ema, int keep_best = 0) {
    CheckpointConfig c;
    c.keep_last = 1;
    c.keep_best = keep_best;
    c.keep_best_on = on;
    CheckpointManager m(dir_.string(), c);
    TrainingState s;
    s.step = step;
    s.accuracy = 1.0 - ema_accuracy;  // the model's ranking would be the reverse
    s.ema_accuracy = ema_accuracy;
    return m.save(*model_, *opt_, s, "[train]\nepochs = 2\n", std::nullopt, ema_.get());
  }

  std::vector<std::string> kept() const {
    std::vector<std::string> names;
    for (const auto& d : fs::directory_iterator(dir_)) names.push_back(d.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path dir_;
  std::shared_ptr<Module> model_;
  std::unique_ptr<Optimizer> opt_;
  std::unique_ptr<ModelEma> ema_;
};

TEST_F(CheckpointEma, AverageAndCountsRoundTrip) {
  const std::string path = save(7, 0.5);
  const auto before = ema_->state_tensors();
  for (auto& p : model_->parameters()) p.data().fill_(9.0);
  ema_->after_optimizer_step(false, nullptr);  // disturb the average and its counts
  const TrainingState s = load_checkpoint(path, *model_, *opt_, ema_.get());
  EXPECT_EQ(s.ema_accuracy, 0.5);
  EXPECT_EQ(ema_->steps(), 3);
  EXPECT_EQ(ema_->updates(), 3);
  const auto after = ema_->state_tensors();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i)
    EXPECT_EQ(after[i].second.to_vector<double>(), before[i].second.to_vector<double>()) << after[i].first;
}

TEST_F(CheckpointEma, ADamagedAverageIsNamed) {
  const fs::path file = fs::path(save(7, 0.5)) / "ema.safetensors";
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-2, std::ios::end);  // inside the last tensor's data
    f.put('\x7f');
  }
  try {
    verify_checkpoint(file.parent_path().string());
    ADD_FAILURE() << "a damaged ema.safetensors verified";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("ema.safetensors"), std::string::npos) << e.what();
  }
}

TEST_F(CheckpointEma, ACheckpointWithoutAnAverageRestartsItFromTheLoadedWeights) {
  CheckpointManager m(dir_.string(), CheckpointConfig{});
  TrainingState s;
  s.step = 5;
  const std::string path = m.save(*model_, *opt_, s, "", std::nullopt, nullptr);
  load_checkpoint(path, *model_, *opt_, ema_.get());
  EXPECT_EQ(ema_->steps(), 5);
  EXPECT_EQ(ema_->updates(), 0);  // the next update copies, as a first one does
  const auto state = ema_->state_tensors();
  const auto params = model_->named_parameters();
  for (const auto& p : params)
    for (const auto& [name, t] : state)
      if (name == p.name) EXPECT_EQ(t.to_vector<double>(), p.param.data().to_vector<double>()) << name;
}

TEST_F(CheckpointEma, KeepBestRanksByTheAverageWhenAsked) {
  save(1, 0.9, KeepBestOn::ema, 1);
  save(2, 0.2, KeepBestOn::ema, 1);
  save(3, 0.5, KeepBestOn::ema, 1);
  EXPECT_EQ(kept(), (std::vector<std::string>{"step-00000001", "step-00000003"}));
  fs::remove_all(dir_);
  save(1, 0.9, KeepBestOn::model, 1);  // the model's accuracy is 1 - the average's
  save(2, 0.2, KeepBestOn::model, 1);
  save(3, 0.5, KeepBestOn::model, 1);
  EXPECT_EQ(kept(), (std::vector<std::string>{"step-00000002", "step-00000003"}));
}

}  // namespace
}  // namespace trainer
