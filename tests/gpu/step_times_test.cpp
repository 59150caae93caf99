// On a GPU the step-time breakdown must describe the step: the phases, timed on the device, fit inside
// the step, timed on the host. A loop whose host wait for the device falls between two steps' timed
// intervals breaks this (the host's steps look shorter than the device's work), and trainer bench,
// which takes img/s from the host's step times, then overstates throughput: it reported 143,749 img/s
// for an eager resnet18 b512 step that runs at 72k, before the step fence (app/train/host_readback.h).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "app/trainer_process.h"
#include "metrics/step_timer.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;
using trainer::testing::read_csv_columns;
using trainer::testing::run_trainer;

class GpuStepTimes : public trainer::testing::TrainerRunTest {
 protected:
  GpuStepTimes() : TrainerRunTest("trainer_gpu_step_times_") {}
};

// resnet18-cifar at batch 256 in bf16: the device's step (~4 ms) is longer than the host's work to
// queue it, the case where the host runs ahead.
TEST_F(GpuStepTimes, DevicePhasesFitInsideTheHostStepEagerAndReplayed) {
  REQUIRE_GPU();
  const fs::path cfg = dir_ / "r18.toml";
  std::ofstream(cfg)
      << "[model]\nname = \"resnet18\"\n"
         "[data]\ndataset = \"synthetic\"\nsynthetic_samples = 20480\nsynthetic_image_size = 32\n"
         "batch_size = 256\n"
         "[train]\ndevice = \"cuda\"\nprecision = \"bf16\"\nepochs = 1\nmax_steps = 60\n"
         "eval_every_epochs = 0\n"
         "[checkpoint]\nevery_epochs = 0\nsave_final = false\n";
  for (const char* graph : {"false", "true"}) {
    const auto r = run_trainer("train " + cfg.string() + " --set train.cuda_graph=" + graph +
                               " --set train.run_dir=" + run_dir(graph));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto csv = read_csv_columns(dir_ / graph / "step_times.csv");
    const std::vector<double>& step = csv["step_seconds"];
    ASSERT_EQ(step.size(), 60u) << graph;
    double steps = 0.0, phases = 0.0;
    for (std::size_t i = 10; i < step.size(); ++i) {  // past the warm-up and the capture
      steps += step[i];
      for (Phase p : kExclusivePhases) phases += csv[std::string(phase_name(p)) + "_seconds"].at(i);
    }
    // Two clocks (host, device) measure the same work: equal to a few percent, never half.
    EXPECT_LE(phases, 1.05 * steps) << graph << ": phases " << phases << " s in steps of " << steps << " s";
    EXPECT_GE(phases, 0.7 * steps) << graph << ": phases " << phases << " s in steps of " << steps << " s";
  }
}

}  // namespace
}  // namespace trainer
