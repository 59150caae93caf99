// The error that ends a run reaches its log file (train.log), not only stderr.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

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
  EXPECT_NE(full_log.find("trainer: error: checkpoint"), std::string::npos) << full_log;
}

}  // namespace
