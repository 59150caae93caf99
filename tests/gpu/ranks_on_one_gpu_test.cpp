// The seed guides' "every rank on GPU 0": two ranks started by hand with the same LOCAL_RANK would
// share one GPU (out of memory, or both slow while another GPU idles; NCCL itself refuses a duplicate
// GPU only with its own terse error). `trainer train` compares the ranks' GPU UUIDs before any
// communicator exists, so both ranks stop at once, naming the GPU, the ranks and what to do.
// Needs one GPU only.
#include <gtest/gtest.h>

#include <string>

#include "app/run/device_setup.h"
#include "app/trainer_process.h"
#include "dist/multi_process.h"
#include "nn/cuda/cuda_backend.h"

namespace trainer {
namespace {

using trainer::testing::free_port;

class RanksOnOneGpu : public trainer::testing::TrainerRunTest {
 protected:
  RanksOnOneGpu() : TrainerRunTest("trainer_one_gpu_") {}
};

TEST_F(RanksOnOneGpu, GpuIdIsTheUuidNvidiaSmiShows) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const std::string id = gpu_id(Device::cuda(0));
  ASSERT_EQ(id.size(), 40u) << id;  // GPU- + 8-4-4-4-12 hex digits
  EXPECT_EQ(id.rfind("GPU-", 0), 0u) << id;
  EXPECT_EQ(id, gpu_id(Device::cuda(0)));
  EXPECT_EQ(gpu_id(Device::cpu()), "");
}

TEST_F(RanksOnOneGpu, TwoRanksWithTheSameLocalRankStopNamingTheGpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const std::string cfg = write_small_config("[train]\ndevice = \"cuda\"\n[dist]\ntimeout_seconds = 30\n");
  const std::string args = "train " + cfg + " --set train.run_dir=" + run_dir("run");
  const auto ranks = trainer::testing::run_ranks(dir_, free_port(), {args, args},
                                                 {"LOCAL_RANK=0 timeout 120", "LOCAL_RANK=0 timeout 120"});
  const std::string id = gpu_id(Device::cuda(0));
  for (const trainer::testing::RunResult& rank : ranks) {
    EXPECT_NE(rank.exit_code, 0) << rank.output;
    EXPECT_NE(rank.output.find("GPU shared: '" + id + "' on rank(s) 0, 1"), std::string::npos) << rank.output;
    EXPECT_NE(rank.output.find("each rank needs a GPU of its own"), std::string::npos) << rank.output;
  }
}

}  // namespace
}  // namespace trainer
