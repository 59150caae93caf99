// `trainer doctor` on a GPU host: the GPU checks the CPU tests cannot reach. Every visible GPU is
// listed with the driver, a config on the GPU passes the device check, and the collective checks
// match the number of GPUs: with 2 or more, the peer-to-peer matrix and an NCCL all-reduce whose
// result is checked; with one, both say why they are skipped and the CPU communicator is tested.
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "app/trainer_process.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainer {
namespace {

using trainer::testing::run_trainer;

class DoctorOnGpu : public trainer::testing::TrainerRunTest {
 protected:
  DoctorOnGpu() : TrainerRunTest("trainer_gpu_doctor_") {}
};

TEST_F(DoctorOnGpu, ListsTheGpusAndChecksTheCollectivesForTheirNumber) {
  REQUIRE_GPU();
  const int gpus = cuda_device_count();
  const auto r = run_trainer(
      "doctor " + write_small_config("") +
      " --set train.device=cuda --set train.precision=bf16 --set train.run_dir=" + run_dir("run"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("FAIL"), std::string::npos) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("PASS  gpu +" + std::to_string(gpus) +
                                                     R"( visible \(0: .* sm_\d+.*\), driver CUDA \d+)")))
      << r.output;
  const auto has = [&](const std::string& pattern) {
    return std::regex_search(r.output, std::regex(pattern));
  };
  EXPECT_TRUE(has(R"(PASS  device +cuda:0, precision bf16)")) << r.output;
  if (gpus >= 2) {
    EXPECT_TRUE(has("(PASS|WARN)  peer-to-peer ")) << r.output;
    EXPECT_TRUE(has("PASS  nccl allreduce +NCCL across " + std::to_string(gpus) +
                    " GPUs of this process: sum and average correct on every rank"))
        << r.output;
  } else {
    EXPECT_TRUE(has(R"(SKIP  peer-to-peer +1 GPU\(s\) visible: nothing to connect)")) << r.output;
    EXPECT_TRUE(has(R"(SKIP  nccl allreduce +1 GPU\(s\) visible, needs 2 or more)")) << r.output;
    EXPECT_TRUE(has("PASS  allreduce +tcp communicator, 2 ranks")) << r.output;
  }
}

}  // namespace
}  // namespace trainer
