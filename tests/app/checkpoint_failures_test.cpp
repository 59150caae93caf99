// Checkpoints under failure, end to end: the trainer binary killed while writing one, and a disk that
// fills up (a real tmpfs of a few hundred KiB, mounted in a user namespace where the kernel allows it).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "app/run/checkpoint.h"
#include "metrics/run_csv_util.h"
#include "trainer_process.h"

namespace {

namespace fs = std::filesystem;

using trainer::testing::read_file;
using trainer::testing::run_trainer;
using trainer::testing::RunResult;

class CheckpointFailures : public trainer::testing::TrainerRunTest {
 protected:
  CheckpointFailures() : TrainerRunTest("trainer_ckptfail_") {}

  // 16 steps in 2 epochs of 8, a checkpoint every 4 steps.
  std::string write_config(const std::string& extra = "") {
    return write_small_config("[train]\nepochs = 2\n[checkpoint]\nevery_steps = 4\nkeep_last = 3\n" + extra);
  }
  static int64_t csv_steps(const fs::path& csv) {
    const std::string s = read_file(csv);
    return std::count(s.begin(), s.end(), '\n') - 1;  // less the header
  }
};

// The process is SIGKILLed by the test hook with checkpoint step-8 complete in its temp directory but
// not renamed. step-4 stays the newest checkpoint; --resume auto removes the stale temp directory
// (saying so), resumes from step 4 and ends bit-identical to a run that never crashed.
TEST_F(CheckpointFailures, KilledBetweenWriteAndRenameResumesFromTheLastGoodCheckpoint) {
  const std::string cfg = write_config();
  ASSERT_EQ(run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("full")).exit_code, 0);
  RunResult crashed = run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("cut"),
                                  "TRAINER_TEST_CRASH_BEFORE_RENAME=8");
  EXPECT_NE(crashed.exit_code, 0) << crashed.output;
  EXPECT_EQ(crashed.output.find("step-00000008"), std::string::npos)
      << crashed.output;  // died before logging it
  const fs::path ckpts = dir_ / "cut/checkpoints";
  EXPECT_TRUE(fs::exists(ckpts / ".step-00000008.tmp"));
  EXPECT_FALSE(fs::exists(ckpts / "step-00000008"));
  EXPECT_NO_THROW(trainer::verify_checkpoint((ckpts / "step-00000004").string()));
  EXPECT_EQ(csv_steps(dir_ / "cut/train_steps.csv"), 8);  // steps 5..8 were logged, then lost

  RunResult resumed =
      run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("cut") + " --resume auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("removed " + (ckpts / ".step-00000008.tmp").string()), std::string::npos)
      << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from " + (ckpts / "step-00000004").string()), std::string::npos)
      << resumed.output;
  EXPECT_FALSE(fs::exists(ckpts / ".step-00000008.tmp"));
  EXPECT_EQ(trainer::testing::without_wall_time(read_file(dir_ / "full/train_steps.csv")),
            trainer::testing::without_wall_time(read_file(dir_ / "cut/train_steps.csv")));
  EXPECT_EQ(read_file(dir_ / "full/checkpoints/final.safetensors"), read_file(ckpts / "final.safetensors"));
}

// A real full disk: checkpoint.dir on a tmpfs of a chosen size (or mounted read-only). Runs inside
// `unshare -rm` (an unprivileged user + mount namespace); the tmpfs vanishes with the namespace, so
// the script copies what is left on it out before leaving.
class FullDisk : public CheckpointFailures {
 protected:
  void SetUp() override {
    CheckpointFailures::SetUp();
    if (std::system("unshare -rm sh -c 'mount -t tmpfs -o size=64k tmpfs /tmp' >/dev/null 2>&1") != 0)
      GTEST_SKIP() << "this kernel does not let an unprivileged user mount a tmpfs (unshare -rm)";
  }
  // Trains with the checkpoints on a tmpfs mounted with `options` ("size=N", "ro"); what it held at the
  // end is copied to `name`. With `run_dir_too`, the run directory is on it as well.
  // `env`: "NAME=value ..." for the trainer.
  RunResult train_on_tmpfs(const std::string& cfg, const std::string& options, const std::string& name,
                           bool run_dir_too = false, const std::string& env = "") {
    const std::string mnt = (dir_ / (name + ".mnt")).string(), copy = (dir_ / name).string();
    fs::create_directories(mnt);
    const std::string run = run_dir_too ? mnt + "/run" : run_dir(name + ".run");
    const std::string script = "mount -t tmpfs -o " + options + " tmpfs " + mnt + " && " + env + " " +
                               trainer::testing::trainer_binary() + " train " + cfg +
                               " --set train.run_dir=" + run + " --set checkpoint.dir=" + mnt +
                               "/ckpt; rc=$?; cp -a " + mnt + "/ckpt " + copy + " 2>/dev/null; exit $rc";
    FILE* pipe = popen(("unshare -rm bash -c '" + script + "' 2>&1").c_str(), "r");
    std::string out;
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
    const int status = pclose(pipe);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
  }
  RunResult train_on_tmpfs(const std::string& cfg, int64_t bytes, const std::string& name) {
    return train_on_tmpfs(cfg, "size=" + std::to_string(bytes), name);
  }
  // Bytes of tmpfs pages one checkpoint of this config takes.
  int64_t checkpoint_pages_bytes(const std::string& cfg) {
    RunResult r =
        run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("probe") + " --set train.max_steps=4");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    int64_t bytes = 0;
    for (const auto& f : fs::directory_iterator(dir_ / "probe/checkpoints/step-00000004"))
      bytes += (static_cast<int64_t>(f.file_size()) + 4095) / 4096 * 4096;
    return bytes;
  }
  static std::vector<std::string> names_in(const fs::path& dir) {
    std::vector<std::string> names;
    for (const auto& d : fs::directory_iterator(dir)) names.push_back(d.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
};

// A disk that holds one checkpoint but not two is refused before the first step, not after the run.
TEST_F(FullDisk, ACheckpointDirectoryTooSmallForTwoCheckpointsStopsTheRunAtStart) {
  const std::string cfg = write_config();
  const int64_t one = checkpoint_pages_bytes(cfg);
  RunResult r = train_on_tmpfs(cfg, one + one / 2, "small");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("trainer: error: not enough free space in " + (dir_ / "small.mnt/ckpt").string() +
                          " (checkpoint.dir) for two checkpoints of "),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("HINT: free space there, or set checkpoint.dir"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("epoch 1/2 step"), std::string::npos) << r.output;  // no step ran
  EXPECT_FALSE(fs::exists(dir_ / "small.run/train_steps.csv"));
}

// A read-only disk under checkpoint.dir, or under train.run_dir, is found out at start, before any
// step, with the trainer's message.
TEST_F(FullDisk, AReadOnlyCheckpointOrRunDirectoryStopsTheRunAtStart) {
  const std::string cfg = write_config();
  RunResult ckpt = train_on_tmpfs(cfg, "ro", "ro_ckpt");
  EXPECT_EQ(ckpt.exit_code, 1) << ckpt.output;
  EXPECT_NE(
      ckpt.output.find("trainer: error: cannot create the directory " + (dir_ / "ro_ckpt.mnt/ckpt").string() +
                       " (checkpoint.dir): Read-only file system. HINT: that file system is mounted "
                       "read-only"),
      std::string::npos)
      << ckpt.output;
  EXPECT_EQ(ckpt.output.find("epoch 1/2 step"), std::string::npos) << ckpt.output;
  RunResult run = train_on_tmpfs(cfg, "ro", "ro_run", true);
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(
      run.output.find("trainer: error: cannot create the directory " + (dir_ / "ro_run.mnt/run").string() +
                      " (train.run_dir): Read-only file system. HINT: "),
      std::string::npos)
      << run.output;
}

// checkpoint.on_error = "continue" (the default), a disk with room for two checkpoints that fills up
// as the run goes (keep_last = 3): step-4 and step-8 are written, step-12 fails with ENOSPC and the
// run trains on; the final checkpoint (step 16) cannot be written there either, so it is written into
// the run directory instead, and the run exits 1 saying where it is.
TEST_F(FullDisk, PeriodicFailureContinuesAndTheFinalCheckpointIsRescuedIntoTheRunDirectory) {
  const std::string cfg = write_config();
  const int64_t one = checkpoint_pages_bytes(cfg);
  RunResult r = train_on_tmpfs(cfg, 2 * one + one / 2, "cont");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("No space left on device"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("earlier checkpoints are intact, training continues"), std::string::npos)
      << r.output;
  // Room for two at start, not for the four that keep_last = 3 holds at once: a warning, not a stop.
  EXPECT_NE(r.output.find("warning: not enough free space in " + (dir_ / "cont.mnt/ckpt").string() +
                          " (checkpoint.dir) for 4 more checkpoints of "),
            std::string::npos)
      << r.output;
  EXPECT_EQ(csv_steps(dir_ / "cont.run/train_steps.csv"), 16);  // trained to the end
  EXPECT_EQ(names_in(dir_ / "cont"),
            (std::vector<std::string>{".trainer.lock", "step-00000004", "step-00000008"}));
  EXPECT_EQ(trainer::verify_checkpoint((dir_ / "cont/step-00000008").string()).step, 8);
  const fs::path rescued = dir_ / "cont.run/rescued-checkpoints/step-00000016";
  EXPECT_NE(r.output.find("the final checkpoint could not be written: checkpoint " +
                          (dir_ / "cont.mnt/ckpt/step-00000016").string() + " not written"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("it was written to " + rescued.string() +
                          " instead. HINT: continue with --resume " + rescued.string()),
            std::string::npos)
      << r.output;
  EXPECT_NE(read_file(dir_ / "cont.run/train.log").find("it was written to " + rescued.string()),
            std::string::npos);
  EXPECT_EQ(trainer::verify_checkpoint(rescued.string()).step, 16);
  // --resume auto in that run directory (as `trainer launch --max-restarts` does) takes the rescued
  // step 16 over checkpoint.dir's step 8.
  RunResult again = run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("cont.run") +
                                " --set checkpoint.dir=" + (dir_ / "cont").string() + " --resume auto");
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("resume auto: " + rescued.string() + " (rescued when "), std::string::npos)
      << again.output;
  EXPECT_NE(again.output.find("resumed from " + rescued.string() + ": step 16"), std::string::npos)
      << again.output;
  RunResult resumed = run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("again") + " --resume " +
                                  (dir_ / "cont/step-00000008").string());
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from"), std::string::npos) << resumed.output;
}

// The at-signal checkpoint is rescued the same way: SIGTERM after step 13 on a disk full since step 12's
// checkpoint; the run exits 1 (not 143: its checkpoint is not where it was configured) naming the
// rescued copy, which resumes.
TEST_F(FullDisk, TheAtSignalCheckpointIsRescuedIntoTheRunDirectoryToo) {
  const std::string cfg = write_config();
  const int64_t one = checkpoint_pages_bytes(cfg);
  const RunResult r = train_on_tmpfs(cfg, "size=" + std::to_string(2 * one + one / 2), "sig", false,
                                     "TRAINER_TEST_SIGTERM_AT_STEP=13");
  const std::string& out = r.output;
  EXPECT_EQ(r.exit_code, 1) << out;
  EXPECT_NE(out.find("received signal 15 at step 13: writing a checkpoint before exiting"), std::string::npos)
      << out;
  const fs::path rescued = dir_ / "sig.run/rescued-checkpoints/step-00000013";
  EXPECT_NE(out.find("it was written to " + rescued.string() + " instead"), std::string::npos) << out;
  EXPECT_EQ(trainer::verify_checkpoint(rescued.string()).step, 13);
  RunResult resumed = run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("sig.more") +
                                  " --resume " + rescued.string());
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from " + rescued.string() + ": step 13"), std::string::npos)
      << resumed.output;
}

// checkpoint.on_error = "stop": the run ends at the step whose checkpoint failed, with the error. On a
// disk with room for two, step-4 and step-8 (written once, as the epoch's checkpoint) fit; step 12's no
// longer does: the run stops there, step-4 and step-8 intact.
TEST_F(FullDisk, OnErrorStopEndsTheRunAtTheFailedCheckpoint) {
  const std::string cfg = write_config("on_error = \"stop\"\n");
  const int64_t one = checkpoint_pages_bytes(cfg);
  RunResult r = train_on_tmpfs(cfg, 2 * one + one / 2, "stop");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("step-00000012 not written"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("No space left on device"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("training continues"), std::string::npos) << r.output;
  EXPECT_EQ(csv_steps(dir_ / "stop.run/train_steps.csv"), 12);
  EXPECT_EQ(trainer::verify_checkpoint((dir_ / "stop/step-00000004").string()).step, 4);
  EXPECT_EQ(trainer::verify_checkpoint((dir_ / "stop/step-00000008").string()).step, 8);
  EXPECT_FALSE(fs::exists(dir_ / "stop/.step-00000012.tmp"));
}

}  // namespace
