// `trainer train` on the GPU goes through the prefetcher (pinned batches, copy stream, normalisation on
// the device): its inputs are bit-identical to the CPU's, so the first step's loss (forward only, from
// the same initial weights) agrees with a CPU run to float32 rounding of the model's arithmetic.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "app/trainer_process.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;
using trainer::testing::read_file;
using trainer::testing::run_trainer;

std::vector<double> losses(const fs::path& csv) {
  std::stringstream in(read_file(csv));
  std::vector<double> out;
  std::string line;
  std::getline(in, line);  // step,epoch,loss,lr
  while (std::getline(in, line)) {
    std::stringstream fields(line);
    std::string step, epoch, loss;
    std::getline(fields, step, ',');
    std::getline(fields, epoch, ',');
    std::getline(fields, loss, ',');
    out.push_back(std::stod(loss));
  }
  return out;
}

class TrainInput : public trainer::testing::TrainerRunTest {
 protected:
  TrainInput() : TrainerRunTest("trainer_gpu_input_") {}
};

TEST_F(TrainInput, GpuRunsWithAndWithoutTheInputPipelineMatchTheCpu) {
  REQUIRE_GPU();
  const std::string cfg =
      write_small_config("workers = 2\n[train]\nepochs = 2\nlog_every_steps = 4\n[optim]\nlr = 0.05\n");
  struct Variant {
    const char* name;
    const char* args;
  };
  const Variant variants[] = {{"cpu", " --set train.device=cpu"},
                              {"cuda", " --set train.device=cuda --set data.gpu_input_pipeline=false"},
                              {"pipeline", " --set train.device=cuda --set data.gpu_input_pipeline=true"}};
  for (const Variant& v : variants) {
    const auto r = run_trainer("train " + cfg + v.args + " --set train.run_dir=" + run_dir(v.name));
    ASSERT_EQ(r.exit_code, 0) << v.name << "\n" << r.output;
  }
  const std::vector<double> cpu = losses(dir_ / "cpu" / "train_steps.csv");
  ASSERT_EQ(cpu.size(), 16u);  // 8 batches per epoch, 2 epochs
  for (const char* name : {"cuda", "pipeline"}) {
    const std::vector<double> gpu = losses(dir_ / name / "train_steps.csv");
    ASSERT_EQ(gpu.size(), cpu.size()) << name;  // every batch arrived, none twice
    EXPECT_NEAR(gpu[0], cpu[0], 1e-5 * std::abs(cpu[0])) << name;
    for (size_t i = 0; i < cpu.size(); ++i)
      EXPECT_NEAR(gpu[i], cpu[i], 1e-2 * std::abs(cpu[i])) << name << " step " << i + 1;
  }
  // The prefetcher's batches equal the synchronous path's bit for bit, so the two GPU runs agree as
  // closely as two GPU runs do.
}

}  // namespace
}  // namespace trainer
