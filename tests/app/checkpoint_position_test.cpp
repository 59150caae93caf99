// The manifest's own CRC-32C (and the older format without it) and the range check of a checkpoint's
// position against the data it resumes (app/run/checkpoint.h: verify_checkpoint, check_position_fits).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "app/run/checkpoint.h"
#include "nn/models/registry.h"
#include "nn/optim/sgd.h"
#include "tiny_mlp.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

class CheckpointPosition : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("trainer_ckpt_position_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    model_ = testing::tiny_mlp();
    opt_ = std::make_unique<Sgd>(model_->named_parameters(), SgdOptions{});
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string save(const TrainingState& s) {
    CheckpointManager m(dir_.string(), CheckpointConfig{});
    return m.save(*model_, *opt_, s, "[train]\nepochs = 2\n");
  }
  static std::string manifest_text(const std::string& checkpoint) {
    std::ifstream in(fs::path(checkpoint) / "checkpoint.toml");
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  static void write_manifest(const std::string& checkpoint, const std::string& text) {
    std::ofstream(fs::path(checkpoint) / "checkpoint.toml", std::ios::trunc) << text;
  }
  static std::string error_of(const std::function<void()>& f) {
    try {
      f();
    } catch (const CheckpointError& e) {
      return e.what();
    }
    return "";
  }

  fs::path dir_;
  std::shared_ptr<Module> model_;
  std::unique_ptr<Optimizer> opt_;
};

TEST_F(CheckpointPosition, TheManifestCarriesItsOwnCrcAndOlderManifestsStillLoad) {
  TrainingState s;
  s.step = 5;
  const std::string path = save(s);
  const std::string text = manifest_text(path);
  ASSERT_EQ(text.rfind("manifest_crc32c = \"", 0), 0u) << text;
  EXPECT_EQ(verify_checkpoint(path).step, 5);
  // Without its CRC line, a format 2 manifest is refused...
  const std::string body = text.substr(text.find('\n') + 1);
  write_manifest(path, body);
  EXPECT_NE(error_of([&] { verify_checkpoint(path); }).find("its first line, manifest_crc32c, is missing"),
            std::string::npos);
  // ...while a format 1 manifest (written before manifests carried one) is read as before.
  std::string old = body;
  old.replace(old.find("format = 2"), 10, "format = 1");
  write_manifest(path, old);
  EXPECT_EQ(verify_checkpoint(path).step, 5);
}

TEST_F(CheckpointPosition, BatchInEpochMayReachTheEpochsBatchesButNotPassThem) {
  TrainingState s;
  s.world_size = 2;
  s.batch_size = 32;
  s.epoch = 1;
  const ResumeLimits limits{256, false, 2};  // 128 samples per rank: 4 batches
  s.batch_in_epoch = 4;                      // the epoch's steps are done, its evaluation is not
  EXPECT_NO_THROW(check_position_fits(s, "ckpt", limits));
  s.batch_in_epoch = 5;
  const std::string error = error_of([&] { check_position_fits(s, "ckpt", limits); });
  EXPECT_NE(error.find("ckpt/checkpoint.toml: field 'batch_in_epoch' is 5, past the epoch's 4 batches"),
            std::string::npos)
      << error;
  // A re-sharded epoch (another world size) counts from its offset: 96 samples left, 2 batches per rank.
  s.epoch_sample_offset = 160;
  s.batch_in_epoch = 3;
  EXPECT_NE(error_of([&] { check_position_fits(s, "ckpt", limits); }).find("past the epoch's 2 batches"),
            std::string::npos);
}

TEST_F(CheckpointPosition, EpochPastTheConfiguredEpochsIsRefused) {
  TrainingState s;
  s.batch_size = 32;
  s.epoch = 2;  // a finished 2-epoch run's final checkpoint
  EXPECT_NO_THROW(check_position_fits(s, "ckpt", ResumeLimits{256, false, 2}));
  s.epoch = 3;
  const std::string error = error_of([&] { check_position_fits(s, "ckpt", ResumeLimits{256, false, 2}); });
  EXPECT_NE(error.find("field 'epoch' is 3 (0-based), past train.epochs = 2"), std::string::npos) << error;
}

TEST_F(CheckpointPosition, AStepOtherThanTheDirectorysIsRefused) {
  TrainingState s;
  s.step = 133;
  const std::string path = save(s);
  const fs::path renamed = dir_ / "step-00000130";
  fs::rename(path, renamed);
  const std::string error = error_of([&] { verify_checkpoint(renamed.string()); });
  EXPECT_NE(error.find("field 'step' is 133 but the checkpoint's directory is step-00000130"),
            std::string::npos)
      << error;
}

}  // namespace
}  // namespace trainer
