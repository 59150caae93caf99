// The error that ends a run reaches its log file (train.log), not only stderr.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "dist/multi_process.h"
#include "run_faults.h"

namespace {

namespace fs = std::filesystem;
using namespace trainer::testing;

// ---- 1. the error that ends a run is in its log file

TEST_F(RunFaults, TheErrorThatEndsARunIsInTrainLog) {
  const RunResult nan = train(write_config(), "nan", "", " --set optim.lr=1e12");
  ASSERT_EQ(nan.exit_code, 1) << nan.output;
  const std::string log = read_file(dir_ / "nan/train.log");
  EXPECT_NE(log.find("trainer: error: loss is"), std::string::npos) << log;
  EXPECT_NE(log.find("training diverged. HINT"), std::string::npos) << log;

  // A final checkpoint that cannot be written (a file-size limit): its error, not only the warnings.
  const RunResult full = run_trainer(
      "train " + write_config("[checkpoint]\nevery_steps = 4\n") + " --set train.run_dir=" + run_dir("full"),
      "", "ulimit -f 64;");
  ASSERT_EQ(full.exit_code, 1) << full.output;
  const std::string full_log = read_file(dir_ / "full/train.log");
  EXPECT_NE(full_log.find("trainer: error: the final checkpoint could not be written: checkpoint "),
            std::string::npos)
      << full_log;
  // Its rescue into the run directory met the same limit: the log says what is on disk instead.
  EXPECT_NE(full_log.find("; no checkpoint of this run is on disk (training reached step 16). HINT: "),
            std::string::npos)
      << full_log;
}

// Ranks started with different configs stop at start-up: each rank's log file (train.log,
// train.rank1.log) says why, not only its stderr.
TEST_F(RunFaults, TheStartUpMismatchIsInEveryRanksLog) {
  const std::string cfg = write_config();
  const std::string run = " --set train.run_dir=" + run_dir("ranks");
  const std::vector<RunResult> r =
      run_ranks(dir_, free_port(), {"train " + cfg + run, "train " + cfg + " --set optim.lr=0.2" + run});
  for (int rank : {0, 1}) {
    EXPECT_NE(r[rank].exit_code, 0) << r[rank].output;
    const std::string log = read_file(dir_ / "ranks" / (rank == 0 ? "train.log" : "train.rank1.log"));
    const size_t error = log.find("trainer: error:");
    ASSERT_NE(error, std::string::npos) << "rank " << rank << ":\n" << log;
    EXPECT_NE(log.find("optim.lr", error), std::string::npos) << "rank " << rank << ":\n" << log;
  }
}

}  // namespace
