#include "app/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "app/crc32c.h"
#include "nn/models/registry.h"
#include "nn/optim/adamw.h"
#include "nn/optim/sgd.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

TEST(Crc32c, KnownVectors) {
  // RFC 3720 test vectors for CRC-32C.
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  const std::vector<uint8_t> zeros(32, 0), ones(32, 0xff);
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  // Incremental equals one shot.
  EXPECT_EQ(crc32c("6789", 4, crc32c("12345", 5)), 0xE3069283u);
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("trainer_ckpt_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    ModelOptions m;
    m.name = "mlp";
    m.in_channels = 1;
    m.image_size = 4;
    m.num_classes = 3;
    model_ = create_model(m);
    SgdOptions so;
    so.momentum = 0.9;
    opt_ = std::make_unique<Sgd>(model_->named_parameters(), so);
    for (auto& p : model_->parameters()) p.grad() = Tensor::full(p.shape(), 0.5);
    opt_->step();  // momentum buffers now exist
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string save(int64_t step, double accuracy = -1, int keep_last = 3, int keep_best = 0) {
    CheckpointConfig c;
    c.keep_last = keep_last;
    c.keep_best = keep_best;
    CheckpointManager m(dir_.string(), c);
    TrainingState s;
    s.step = step;
    s.epoch = 1;
    s.batch_in_epoch = 7;
    s.accuracy = accuracy;
    s.rng_states = {"rng state with spaces 123"};
    return m.save(*model_, *opt_, s, "[train]\nepochs = 2\n");
  }

  fs::path dir_;
  std::shared_ptr<Module> model_;
  std::unique_ptr<Optimizer> opt_;
};

TEST_F(CheckpointTest, RoundTripRestoresModelOptimizerAndState) {
  const std::string path = save(42);
  EXPECT_TRUE(fs::exists(fs::path(path) / "model.safetensors"));
  const auto before = model_->parameters()[0].data().to_vector<float>();
  const auto opt_before = opt_->state_tensors();
  // Disturb everything, then load.
  for (auto& p : model_->parameters()) p.data().fill_(0.0);
  for (auto& p : model_->parameters()) p.grad() = Tensor::full(p.shape(), 1.0);
  opt_->step();
  TrainingState s = load_checkpoint(path, *model_, *opt_);
  EXPECT_EQ(s.step, 42);
  EXPECT_EQ(s.epoch, 1);
  EXPECT_EQ(s.batch_in_epoch, 7);
  ASSERT_EQ(s.rng_states.size(), 1u);
  EXPECT_EQ(s.rng_states[0], "rng state with spaces 123");
  EXPECT_EQ(model_->parameters()[0].data().to_vector<float>(), before);
  const auto opt_after = opt_->state_tensors();
  ASSERT_EQ(opt_after.size(), opt_before.size());
  for (size_t i = 0; i < opt_after.size(); ++i)
    EXPECT_EQ(opt_after[i].second.to_vector<double>(), opt_before[i].second.to_vector<double>()) << opt_after[i].first;
}

TEST_F(CheckpointTest, KeepLastAndKeepBestPrune) {
  save(1, 0.50, 2, 1);
  save(2, 0.90, 2, 1);
  save(3, 0.60, 2, 1);
  save(4, 0.70, 2, 1);
  std::vector<std::string> names;
  for (const auto& d : fs::directory_iterator(dir_)) names.push_back(d.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"step-00000002", "step-00000003", "step-00000004"}));
}

TEST_F(CheckpointTest, CorruptionIsDetectedAndNamed) {
  const std::string path = save(5);
  const fs::path model = fs::path(path) / "model.safetensors";
  {  // flip one byte of the last tensor's data
    std::fstream f(model, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  try {
    verify_checkpoint(path);
    FAIL() << "corruption not detected";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("model.safetensors"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("CRC"), std::string::npos) << e.what();
  }
  fs::resize_file(model, fs::file_size(model) - 100);
  EXPECT_THROW(verify_checkpoint(path), CheckpointError);
}

TEST_F(CheckpointTest, LatestSkipsBrokenAndIncompleteCheckpoints) {
  save(1);
  const std::string second = save(2);
  fs::remove(fs::path(second) / "checkpoint.toml");  // as if the writer died before the manifest
  fs::create_directories(dir_ / ".step-00000003.tmp");  // an abandoned temp directory
  std::vector<std::string> skipped;
  auto latest = find_latest_checkpoint(dir_.string(), &skipped);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(fs::path(latest->path).filename(), "step-00000001");
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("step-00000002"), std::string::npos);
  EXPECT_FALSE(find_latest_checkpoint((dir_ / "nowhere").string(), nullptr).has_value());
}

TEST_F(CheckpointTest, OptimizerMismatchIsRefusedWithAHint) {
  const std::string path = save(3);
  AdamWOptions ao;
  auto adam = std::make_unique<AdamW>(model_->named_parameters(), ao);
  try {
    load_checkpoint(path, *model_, *adam);
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("HINT"), std::string::npos);
  }
}

}  // namespace
}  // namespace trainer
