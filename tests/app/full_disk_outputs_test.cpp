// A full disk under the run directory: a failed write of a CSV or the summary stops the run naming the
// file; train.log is warned about once, and the exit status is non-zero either way.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "run_faults.h"

namespace {

namespace fs = std::filesystem;
using namespace trainer::testing;

// ---- 3. a full disk under the run directory stops the run (or, for train.log, is reported)

TEST_F(RunFaults, AFullDiskForACsvOrTheSummaryStopsTheRunNamingTheFile) {
  for (const std::string file : {"train_steps.csv", "step_times.csv", "summary.json"}) {
    const RunResult r = train(write_config(), file, "TRAINER_TEST_FULL_DISK=" + file);
    EXPECT_EQ(r.exit_code, 1) << file << "\n" << r.output;
    EXPECT_NE(r.output.find("cannot write " + run_dir(file) + "/" + file + ": No space left on device"),
              std::string::npos)
        << file << "\n"
        << r.output;
    EXPECT_NE(r.output.find("HINT: free space"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("done:"), std::string::npos) << r.output;
  }
}

// train.log: the run goes on (the console has every line), warns once, and exits 1 at its end.
TEST_F(RunFaults, AFullDiskForTrainLogWarnsOnceAndTheRunExitsNonZero) {
  const RunResult r = train(write_config(), "log", "TRAINER_TEST_FULL_DISK=train.log");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(count_of(r.output, "warning: cannot write " + run_dir("log") + "/train.log"), 1u) << r.output;
  EXPECT_NE(r.output.find("done:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("its log is incomplete"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(dir_ / "log/checkpoints/final.safetensors"));
  EXPECT_TRUE(fs::exists(dir_ / "log/summary.json"));
}

}  // namespace
