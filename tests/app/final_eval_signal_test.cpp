// A stop signal during the final evaluation is acknowledged.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "run_faults.h"

namespace {

namespace fs = std::filesystem;
using namespace trainer::testing;

// ---- 7. a stop signal during the final evaluation

// The training is complete: the final checkpoint, weights and summary are written, the stop is logged,
// and the exit status is 128 + the signal.
TEST_F(RunFaults, SigtermDuringTheFinalEvaluationIsAcknowledged) {
  const RunResult r = train(write_config(), "s", "TRAINER_TEST_SIGTERM_IN_FINAL_EVAL=1");
  EXPECT_EQ(r.exit_code, 128 + 15) << r.output;
  EXPECT_NE(r.output.find("received signal 15 after the last step (final evaluation) at step 16"),
            std::string::npos)
      << r.output;
  EXPECT_NE(read_file(dir_ / "s/train.log").find("received signal 15"), std::string::npos);
  EXPECT_TRUE(fs::exists(dir_ / "s/checkpoints/final.safetensors"));
  EXPECT_TRUE(fs::exists(dir_ / "s/checkpoints/step-00000016"));
  EXPECT_NE(read_file(dir_ / "s/summary.json").find("\"steps\": 16"), std::string::npos);
}

}  // namespace
