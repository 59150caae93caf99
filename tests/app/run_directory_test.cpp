// The run-directory guards of issue 36 as functions: one run per directory (flock, freed when its
// holder dies), the trainer's own messages for directories that cannot be made or written, the free
// space check, and the checkpoint size estimate the start-up check relies on, against a real save.
#include "app/run/run_directory.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "app/common/file_errors.h"
#include "app/run/checkpoint.h"
#include "nn/optim/adamw.h"
#include "nn/optim/sgd.h"
#include "tiny_mlp.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

class RunDirectory : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("trainer_rundir_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const RunDirectoryError& e) {
    return e.what();
  }
  return "(no RunDirectoryError)";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST_F(RunDirectory, ASecondLockIsRefusedNamingTheHolderAndFreedWhenItIsReleased) {
  const std::string d = dir_.string();
  {
    DirectoryLock first(d, "train.run_dir", "trainer train first.toml");
    const std::string refused =
        message_of([&] { DirectoryLock second(d, "train.run_dir", "trainer train second.toml"); });
    EXPECT_TRUE(contains(refused, d + " (train.run_dir) is in use by another run: pid " +
                                      std::to_string(::getpid()) + " on host "))
        << refused;
    EXPECT_TRUE(contains(refused, ", since ")) << refused;
    EXPECT_TRUE(contains(refused, ": trainer train first.toml. HINT: ")) << refused;
  }
  EXPECT_NO_THROW(DirectoryLock again(d, "train.run_dir", "trainer train third.toml"));
}

// The kernel releases a dead process's flock: a run killed with SIGKILL leaves no stale lock.
TEST_F(RunDirectory, ALockWhoseHolderWasKilledIsFreeAgain) {
  const std::string d = dir_.string();
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    DirectoryLock held(d, "train.run_dir", "trainer train killed.toml");
    [[maybe_unused]] ssize_t n = ::write(ready[1], "x", 1);
    ::pause();
    ::_exit(0);
  }
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  EXPECT_TRUE(contains(message_of([&] { DirectoryLock mine(d, "train.run_dir", "x"); }),
                       "pid " + std::to_string(child) + " on host "));
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_NO_THROW(DirectoryLock mine(d, "train.run_dir", "trainer train next.toml"));
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST_F(RunDirectory, ADirectoryThatCannotBeMadeIsNamedWithTheSettingAndAHint) {
  std::ofstream(dir_ / "file") << "x";
  const std::string path = (dir_ / "file" / "run").string();
  const std::string m = message_of([&] { create_run_directory(path, "train.run_dir"); });
  EXPECT_TRUE(
      contains(m, "cannot create the directory " + path + " (train.run_dir): Not a directory. HINT: "))
      << m;
  EXPECT_TRUE(
      contains(message_of([&] { create_run_directory((dir_ / "file").string(), "checkpoint.dir"); }),
               "(checkpoint.dir): Not a directory. HINT: a file stands where a directory is expected"));
  EXPECT_NO_THROW(create_run_directory((dir_ / "a" / "b").string(), "train.run_dir"));
  EXPECT_NO_THROW(check_writable((dir_ / "a" / "b").string(), "train.run_dir"));
  EXPECT_TRUE(fs::is_empty(dir_ / "a" / "b"));  // the probe file is gone
}

TEST_F(RunDirectory, RoomIsCheckedAgainstTheFileSystemsFreeSpace) {
  const int64_t free = free_bytes(dir_.string());
  ASSERT_GT(free, 0);
  EXPECT_EQ(room_problem(dir_.string(), "checkpoint.dir", 1, "two checkpoints"), "");
  const std::string m =
      room_problem(dir_.string(), "checkpoint.dir", free + (int64_t{1} << 40), "two checkpoints");
  EXPECT_TRUE(
      contains(m, "not enough free space in " + dir_.string() + " (checkpoint.dir) for two checkpoints: "))
      << m;
  EXPECT_TRUE(contains(m, " needed. HINT: ")) << m;
}

TEST(FileErrors, TheLibrarysFilesystemErrorBecomesTheTrainersMessage) {
  const fs::filesystem_error e("cannot create directories", fs::path("/r/run"),
                               std::make_error_code(std::errc::permission_denied));
  EXPECT_EQ(
      describe_filesystem_error(e),
      "cannot create directories /r/run: Permission denied. HINT: this user may not write there: choose a "
      "path it can write (train.run_dir, checkpoint.dir, or the path given on the command line) or fix the "
      "permissions");
  EXPECT_TRUE(contains(file_error_hint(EROFS), "read-only"));
  EXPECT_TRUE(contains(file_error_hint(ENOSPC), "free space"));
  EXPECT_TRUE(contains(file_error_hint(EIO), "check the path"));
}

// The estimate covers a real checkpoint (so the start-up check never passes a directory that cannot
// hold two) without asking for much more (so it does not refuse one that can).
TEST_F(RunDirectory, TheCheckpointSizeEstimateCoversARealCheckpoint) {
  auto model = testing::tiny_mlp();
  for (int optimizer = 0; optimizer < 2; ++optimizer) {
    std::unique_ptr<Optimizer> opt;
    if (optimizer == 0) {
      SgdOptions so;
      so.momentum = 0.9;
      opt = std::make_unique<Sgd>(model->named_parameters(), so);
    } else {
      opt = std::make_unique<AdamW>(model->named_parameters(), AdamWOptions{});
    }
    const std::string config = "[train]\nepochs = 2\n";
    const int64_t estimate = checkpoint_bytes(*model, *opt, config.size());  // before any step
    CheckpointConfig c;
    CheckpointManager m((dir_ / std::to_string(optimizer)).string(), c);
    TrainingState s;
    s.step = 1;
    const std::string path = m.save(*model, *opt, s, config);
    int64_t on_disk = 4096;  // the directory
    for (const auto& f : fs::directory_iterator(path))
      on_disk += (static_cast<int64_t>(f.file_size()) + 4095) / 4096 * 4096;
    EXPECT_GE(estimate, on_disk) << opt->name();
    EXPECT_LE(estimate, on_disk + 32 * 1024) << opt->name();
  }
}

}  // namespace
}  // namespace trainer
