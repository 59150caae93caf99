// fp16 at two ranks: a step whose gradients overflow on one rank only is skipped by every rank. The
// gradients are unscaled after the all-reduce, so an overflow in one rank's backward reaches all of
// them anyway; the agreement on the found-inf flag (an all-reduce max) is what still holds when only
// one rank sees it after the all-reduce. The test hook TRAINER_TEST_INF_GRAD makes rank 1's gradient
// inf at step 5, after the all-reduce: without the agreement rank 0 would take that step and the two
// ranks' weights would part without a word. Two ranks on one GPU through the CPU communicator
// (dist.backend = "tcp" allows a shared GPU), with the device loss scaler.
#include <gtest/gtest.h>

#include <string>

#include "app/trainer_process.h"
#include "dist/multi_process.h"
#include "nn/cuda/cuda_backend.h"

namespace trainer {
namespace {

using trainer::testing::read_file;

class Fp16TwoRanks : public trainer::testing::TrainerRunTest {
 protected:
  Fp16TwoRanks() : TrainerRunTest("trainer_fp16_ranks_") {}
};

TEST_F(Fp16TwoRanks, AnOverflowOnOneRankIsSkippedByBoth) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const std::string cfg = write_small_config(
      "[train]\ndevice = \"cuda\"\nprecision = \"fp16\"\nmax_steps = 8\n[dist]\nbackend = \"tcp\"\n"
      "timeout_seconds = 60\n");
  const std::string args = "train " + cfg + " --set train.run_dir=" + run_dir("run");
  const std::string env = "TRAINER_TEST_INF_GRAD=1:5 LOCAL_RANK=0 timeout 300";
  const auto ranks =
      trainer::testing::run_ranks(dir_, trainer::testing::free_port(), {args, args}, {env, env});
  for (const trainer::testing::RunResult& rank : ranks) ASSERT_EQ(rank.exit_code, 0) << rank.output;
  for (const char* log : {"train.log", "train.rank1.log"}) {
    const std::string text = read_file(dir_ / "run" / log);
    EXPECT_NE(text.find("loss scaling: on the device"), std::string::npos) << log << "\n" << text;
    EXPECT_NE(text.find("step 5: inf/NaN gradients, step skipped"), std::string::npos) << log << "\n" << text;
  }
}

}  // namespace
}  // namespace trainer
