// What an operator hits (issue 36), with the real binary: ranks whose launcher was SIGKILLed stop by
// themselves and say why; two runs given one run directory (or one checkpoint.dir) cannot both run;
// a run directory that cannot be made is named with the trainer's own message. The checkpoint
// directories that are unwritable or too small are in checkpoint_failures_test.cpp (they need a tmpfs).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "app/launcher_process.h"
#include "app/run_faults.h"
#include "app/trainer_process.h"
#include "test_ports.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;
using trainer::testing::count_of;
using trainer::testing::Launcher;
using trainer::testing::read_file;
using trainer::testing::run_trainer;
using trainer::testing::RunResult;
using Clock = std::chrono::steady_clock;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Waits for `pid` (a child of this process, or an orphan it adopted as subreaper) to end; its waitpid
// status, or -1 when it still runs after `seconds`.
int wait_child(pid_t pid, double seconds) {
  for (const auto end = Clock::now() + std::chrono::duration<double>(seconds); Clock::now() < end;) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

// ---- ranks whose launcher died

// Orphans are re-parented to this test process (a child subreaper) instead of init, so the test can
// wait for them and read how they ended.
class OrphanedRanks : public trainer::testing::LauncherTest {
 protected:
  void SetUp() override {
    LauncherTest::SetUp();
    ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  }
  void TearDown() override {
    ::prctl(PR_SET_CHILD_SUBREAPER, 0);
    LauncherTest::TearDown();
  }
  // SIGKILLs the launcher once every rank runs; returns the ranks' pids.
  std::vector<pid_t> kill_launcher(Launcher& l, const std::string& running_line) {
    EXPECT_TRUE(l.wait_for_output(running_line, 120)) << l.output();
    const std::vector<pid_t> pids = l.rank_pids();
    EXPECT_EQ(pids.size(), 2u) << l.output();
    EXPECT_EQ(::kill(l.pid(), SIGKILL), 0);
    EXPECT_EQ(l.wait_exit(30), 128 + SIGKILL);
    return pids;
  }
};

// Any program as a rank: it gets SIGTERM (PR_SET_PDEATHSIG) as its launcher dies.
TEST_F(OrphanedRanks, AnyRankGetsSigtermWhenItsLauncherIsKilled) {
  const std::string script = "touch " + (dir_ / "started.$RANK").string() + "; echo running; exec sleep 60";
  Launcher l(shell_ranks({"--nproc-per-node", "2"}, script), shell_env());
  for (int i = 0; i < 3000 && !(fs::exists(dir_ / "started.0") && fs::exists(dir_ / "started.1")); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const std::vector<pid_t> pids = kill_launcher(l, "[rank 1] running");
  for (pid_t pid : pids) {
    const int status = wait_child(pid, 10);
    ASSERT_NE(status, -1) << "rank pid " << pid << " still runs 10 s after its launcher was killed";
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << "status " << status;
  }
}

// Real training ranks take the normal stop path: they finish the step, checkpoint, exit 143, and each
// one's log says that its launcher is gone.
TEST_F(OrphanedRanks, TrainingRanksCheckpointAndSayTheirLauncherIsGone) {
  const fs::path cfg = dir_ / "long.toml";
  std::ofstream(cfg)
      << "[model]\nname = \"mlp\"\nin_channels = 1\n"
         "[data]\ndataset = \"synthetic\"\nsynthetic_samples = 512\nsynthetic_image_size = 12\n"
         "batch_size = 32\n[train]\nepochs = 100000\nlog_every_steps = 2\n[dist]\n"
         "timeout_seconds = 30\n";
  const std::string run = (dir_ / "run").string();
  Launcher l({"--nproc-per-node", "2", "--master-port",
              std::to_string(trainer::testing::free_ephemeral_port()), "--", "train", cfg.string(), "--set",
              "train.run_dir=" + run});
  const std::vector<pid_t> pids = kill_launcher(l, "[rank 0] epoch 1/100000 step ");
  const auto killed = Clock::now();
  for (pid_t pid : pids) {
    const int status = wait_child(pid, 60);
    ASSERT_NE(status, -1) << "rank pid " << pid << " still runs 60 s after its launcher was killed";
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGTERM) << "status " << status;
  }
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - killed).count(), 30.0);
  for (const char* log : {"train.log", "train.rank1.log"}) {
    const std::string text = read_file(fs::path(run) / log);
    EXPECT_TRUE(contains(text, "received signal 15 at step ")) << log << ":\n" << text;
    EXPECT_TRUE(contains(text, "the trainer launch that started this rank (pid " + std::to_string(l.pid()) +
                                   ") is gone, so the kernel sent SIGTERM (PR_SET_PDEATHSIG)"))
        << log << ":\n"
        << text;
  }
  EXPECT_TRUE(contains(read_file(fs::path(run) / "train.log"), "checkpoint: " + run + "/checkpoints/step-"));
}

// ---- one run per directory

class OneRunPerDirectory : public trainer::testing::RunFaults {
 protected:
  // A run that goes on until stopped: 100000 epochs of 8 steps.
  std::string long_config() { return write_small_config("[train]\nepochs = 100000\nlog_every_steps = 4\n"); }
};

TEST_F(OneRunPerDirectory, ASecondRunOrResumeIntoALiveRunDirectoryStopsNamingTheHolder) {
  const std::string cfg = long_config(), run = run_dir("run");
  Launcher first({cfg, "--set", "train.run_dir=" + run}, {}, "train");
  ASSERT_TRUE(first.wait_for_output("epoch 1/100000 step ", 120)) << first.output();
  const std::string holder =
      "(train.run_dir) is in use by another run: pid " + std::to_string(first.pid()) + " on host ";
  for (const std::string more : {"", " --resume auto"}) {
    const auto start = Clock::now();
    const RunResult second = run_trainer("train " + cfg + " --set train.run_dir=" + run + more);
    EXPECT_EQ(second.exit_code, 1) << second.output;
    EXPECT_TRUE(contains(second.output, "trainer: error: " + run + " " + holder)) << second.output;
    EXPECT_TRUE(contains(second.output, ": trainer train " + cfg + ". HINT: ")) << second.output;
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 30.0);
  }
  ASSERT_EQ(::kill(first.pid(), SIGKILL), 0);
  EXPECT_EQ(first.wait_exit(30), 128 + SIGKILL);
  // Nothing of the refused runs reached the first one's files.
  EXPECT_EQ(count_of(read_file(fs::path(run) / "train.log"), "resolved configuration"), 1u);
  // The kernel freed the killed run's lock: the directory takes a new run.
  const RunResult next =
      run_trainer("train " + cfg + " --set train.run_dir=" + run + " --set train.epochs=1");
  EXPECT_EQ(next.exit_code, 0) << next.output;
}

TEST_F(OneRunPerDirectory, TwoRunsCannotShareACheckpointDirectory) {
  const std::string cfg = long_config(), ckpt = run_dir("shared_checkpoints");
  Launcher first({cfg, "--set", "train.run_dir=" + run_dir("a"), "--set", "checkpoint.dir=" + ckpt}, {},
                 "train");
  ASSERT_TRUE(first.wait_for_output("epoch 1/100000 step ", 120)) << first.output();
  const RunResult second =
      run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("b") + " --set checkpoint.dir=" + ckpt);
  EXPECT_EQ(second.exit_code, 1) << second.output;
  EXPECT_TRUE(contains(
      second.output, ckpt + " (checkpoint.dir) is in use by another run: pid " + std::to_string(first.pid())))
      << second.output;
  ASSERT_EQ(::kill(first.pid(), SIGTERM), 0);
  EXPECT_EQ(first.wait_exit(60), 128 + SIGTERM) << first.output();
}

// Two ranks into a taken directory: rank 0 finds it taken and both ranks stop at once with its message
// (rank 1 does not wait for rank 0 until a timeout).
TEST_F(OneRunPerDirectory, EveryRankOfARefusedRunStopsWithRankZerosMessage) {
  const std::string cfg = long_config(), run = run_dir("run");
  Launcher first({cfg, "--set", "train.run_dir=" + run}, {}, "train");
  ASSERT_TRUE(first.wait_for_output("epoch 1/100000 step ", 120)) << first.output();
  const std::string args = "train " + cfg + " --set train.run_dir=" + run + " --set dist.timeout_seconds=120";
  const auto start = Clock::now();
  const std::vector<RunResult> ranks =
      trainer::testing::run_ranks(dir_, trainer::testing::reserve_port(), {args, args});
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 60.0);
  const std::string taken =
      run + " (train.run_dir) is in use by another run: pid " + std::to_string(first.pid());
  EXPECT_EQ(ranks[0].exit_code, 1) << ranks[0].output;
  EXPECT_TRUE(contains(ranks[0].output, "trainer: error: " + taken)) << ranks[0].output;
  EXPECT_EQ(ranks[1].exit_code, 1) << ranks[1].output;
  EXPECT_TRUE(contains(ranks[1].output, "trainer: error: rank 0 stopped the run: " + taken))
      << ranks[1].output;
  ASSERT_EQ(::kill(first.pid(), SIGTERM), 0);
  EXPECT_EQ(first.wait_exit(60), 128 + SIGTERM) << first.output();
}

// Two runs of one config started together without train.run_dir: the trainer names both directories,
// so the second of a same-second pair takes a suffix instead of being refused (or, before the lock,
// writing into the first one's directory).
TEST_F(OneRunPerDirectory, TwoRunsOfOneConfigStartedTogetherGetADirectoryEach) {
  const std::string cfg = write_config();
  const fs::path cwd = dir_ / "cwd";
  fs::create_directories(cwd);
  const std::string run =
      "cd " + cwd.string() + " && " + trainer::testing::trainer_binary() + " train " + cfg;
  // Both in the background, together; each one's exit status in a file.
  const std::string script =
      "(" + run + " > a.out 2>&1; echo $? > a.rc) & (" + run + " > b.out 2>&1; echo $? > b.rc) & wait";
  ASSERT_EQ(std::system(("bash -c '" + script + "'").c_str()), 0);
  for (const char* rc : {"a.rc", "b.rc"})
    EXPECT_EQ(read_file(cwd / rc), "0\n") << read_file(cwd / "a.out") << read_file(cwd / "b.out");
  std::vector<fs::path> runs;
  for (const auto& d : fs::directory_iterator(cwd / "runs")) runs.push_back(d.path());
  ASSERT_EQ(runs.size(), 2u);
  for (const fs::path& run : runs)
    EXPECT_EQ(count_of(read_file(run / "train.log"), "resolved configuration"), 1u) << run;
}

// ---- a run directory that cannot be made

TEST_F(OneRunPerDirectory, ARunDirectoryThatCannotBeMadeGetsTheTrainersMessage) {
  std::ofstream(dir_ / "a_file") << "x";
  const std::string run = (dir_ / "a_file" / "run").string();
  const RunResult r = run_trainer("train " + write_config() + " --set train.run_dir=" + run);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(
      contains(r.output, "trainer: error: cannot create the directory " + run +
                             " (train.run_dir): Not a directory. HINT: a file stands where a directory "
                             "is expected"))
      << r.output;
  EXPECT_FALSE(contains(r.output, "filesystem error")) << r.output;
}

}  // namespace
}  // namespace trainer
