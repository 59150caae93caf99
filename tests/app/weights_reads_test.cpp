// A weights file is read once per use: load_trained_model (what `trainer predict` and `trainer export`
// start from) takes the model card, the CRC-32C check and the tensors from one read, and load_weights
// (`trainer eval`) checks and loads from one read. Counted by the kernel: inotify's IN_OPEN events on
// the file.
#include <gtest/gtest.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>

#include "app/run/checkpoint.h"
#include "app/run/device_setup.h"
#include "app/run/model_card.h"
#include "app/run/trained_model.h"
#include "tiny_mlp.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

// How many times a file is opened (by anyone) from construction until count().
class FileOpens {
 public:
  explicit FileOpens(const std::string& path) : fd_(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) {
    if (fd_ >= 0 && ::inotify_add_watch(fd_, path.c_str(), IN_OPEN) < 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~FileOpens() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileOpens(const FileOpens&) = delete;
  FileOpens& operator=(const FileOpens&) = delete;
  bool available() const { return fd_ >= 0; }
  int count() {
    alignas(inotify_event) char buf[4096];
    for (ssize_t n; (n = ::read(fd_, buf, sizeof buf)) > 0;)
      for (ssize_t at = 0; at < n;) {
        const auto* event = reinterpret_cast<const inotify_event*>(buf + at);
        if (event->mask & IN_OPEN) ++opens_;
        at += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
      }
    return opens_;
  }

 private:
  int fd_;
  int opens_ = 0;
};

class WeightsReads : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("trainer_weights_reads_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    weights_ = (dir_ / "final.safetensors").string();
    // The tiny MLP's weights with a card of its shape (1x4x4 images, 3 classes), as `trainer train` writes.
    save_weights(weights_, *testing::tiny_mlp(), ModelCard{{"a", "b", "c"}, {4, 4, 1, {0.5f}, {0.25f}}});
  }
  void TearDown() override { fs::remove_all(dir_); }
  Config mlp_config() {
    const fs::path path = dir_ / "mlp.toml";
    std::ofstream(path) << "[model]\nname = \"mlp\"\n[train]\ndevice = \"cpu\"\n";
    return load_config(path.string());
  }
  fs::path dir_;
  std::string weights_;
};

TEST_F(WeightsReads, PredictAndExportReadTheWeightsOnce) {
  const Config config = mlp_config();
  FileOpens opens(weights_);
  if (!opens.available()) GTEST_SKIP() << "inotify is not available here (errno " << errno << ")";
  const TrainedModel t = load_trained_model(config, weights_, cpu_run_device(config), CrcCheck::verify);
  EXPECT_EQ(opens.count(), 1);
  EXPECT_EQ(t.card.class_names.size(), 3u);
  EXPECT_NE(t.weights_note.find("every tensor matches its CRC-32C"), std::string::npos) << t.weights_note;
}

TEST_F(WeightsReads, EvalReadsTheWeightsOnce) {
  FileOpens opens(weights_);
  if (!opens.available()) GTEST_SKIP() << "inotify is not available here (errno " << errno << ")";
  auto model = testing::tiny_mlp();
  EXPECT_NE(load_weights(weights_, *model, CrcCheck::verify).find("matches"), std::string::npos);
  EXPECT_EQ(opens.count(), 1);
}

// The one read still refuses a corrupt tensor, naming it, with the hint.
TEST_F(WeightsReads, TheOneReadStillChecksTheCrcs) {
  {
    std::fstream f(weights_, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-2, std::ios::end);
    f.put('\x55');
  }
  const Config config = mlp_config();
  try {
    load_trained_model(config, weights_, cpu_run_device(config), CrcCheck::verify);
    FAIL() << "a corrupt tensor was loaded";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("is corrupt (CRC-32C mismatch). HINT: copy the file again"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace trainer
