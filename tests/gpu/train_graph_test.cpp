// train.cuda_graph: `trainer train` with its steps replayed as a CUDA graph gives the same run as eager
// steps, bit for bit under train.deterministic: the same loss at every step (50 of them, the learning
// rate changing every step, an epoch's smaller last batch run eagerly between replays) and the same
// final weights, optimizer state and BatchNorm counters, a freeze ending mid-run included. Runs the
// graph cannot take say so in the log.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "app/trainer_process.h"
#include "metrics/run_csv_util.h"
#include "nn/safetensors.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;
using trainer::testing::read_file;
using trainer::testing::run_trainer;

const std::string kSamples = " --set data.synthetic_samples=300 --set data.drop_last=false";

class TrainGraph : public trainer::testing::TrainerRunTest {
 protected:
  TrainGraph() : TrainerRunTest("trainer_gpu_graph_") {}

  // 300 samples (kSamples) in batches of 32: 9 full batches and one of 12 per epoch; 5 epochs = 50 steps.
  std::string config(const std::string& optim) {
    return write_small_config(
        "[train]\nepochs = 5\ndeterministic = true\nlog_every_steps = 10\n"
        "[schedule]\nname = \"onecycle\"\n" +
        optim);
  }

  // Trains with the graph on and off; expects identical step CSVs and final checkpoints.
  void expect_graph_equals_eager(const std::string& cfg, const std::string& args) {
    for (const char* graph : {"true", "false"}) {
      const auto r =
          run_trainer("train " + cfg + kSamples + " --set train.device=cuda --set train.cuda_graph=" + graph +
                      args + " --set train.run_dir=" + run_dir(graph));
      ASSERT_EQ(r.exit_code, 0) << graph << "\n" << r.output;
      if (std::string(graph) == "true") {
        EXPECT_NE(r.output.find("CUDA graph: step 2 captured"), std::string::npos) << r.output;
      } else {
        EXPECT_NE(r.output.find("CUDA graph: off, every step runs eagerly (train.cuda_graph = false)"),
                  std::string::npos)
            << r.output;
      }
    }
    const std::string graphed =
        trainer::testing::without_wall_time(read_file(dir_ / "true" / "train_steps.csv"));
    EXPECT_EQ(std::count(graphed.begin(), graphed.end(), '\n'), 51) << graphed;  // header + 50 steps
    EXPECT_EQ(graphed, trainer::testing::without_wall_time(read_file(dir_ / "false" / "train_steps.csv")));
    // Weights, BatchNorm running statistics and num_batches_tracked; optimizer slots and step counts.
    for (const fs::path& file :
         {fs::path("final.safetensors"), fs::path("step-00000050/optimizer.safetensors")}) {
      const std::string graphed_file = read_file(dir_ / "true" / "checkpoints" / file);
      EXPECT_FALSE(graphed_file.empty()) << file;
      EXPECT_EQ(graphed_file, read_file(dir_ / "false" / "checkpoints" / file)) << file;
    }
  }
};

TEST_F(TrainGraph, SgdReplaysEqualEagerStepsBitwise) {
  REQUIRE_GPU();
  expect_graph_equals_eager(
      config("[optim]\nname = \"sgd\"\nlr = 0.05\nnesterov = true\nweight_decay = 5e-4\n"), "");
}

TEST_F(TrainGraph, AdamWReplaysEqualEagerStepsBitwise) {
  REQUIRE_GPU();
  expect_graph_equals_eager(config("[optim]\nname = \"adamw\"\nlr = 0.002\nweight_decay = 0.05\n"), "");
}

TEST_F(TrainGraph, Bf16ChannelsLastReplaysEqualEagerStepsBitwise) {
  REQUIRE_GPU();
  expect_graph_equals_eager(config("[optim]\nlr = 0.05\n"), " --set train.precision=bf16");
}

// fp16 with the loss scaler on the device, captured with the step. The loss scale starts at 2^24, so
// that the first steps overflow (logit gradients of ~1/32 times 2^22 are beyond fp16's 65504): step 1
// (eager, the warm-up), step 2 (the capture) and step 3 (the first replay) are skipped and back off, as
// their eager counterparts, and the log reports each skip one step late.
const char* const kFp16FromAnOverflowingScale =
    " --set train.precision=fp16 --set train.loss_scale_init=16777216";

// The log of the run with the graph on ("true") or off, after checking that its loss scaler was on the
// device and that it skipped step 3 and backed off.
std::string fp16_run_log(const std::filesystem::path& dir, const char* graph) {
  const std::string log = read_file(dir / graph / "train.log");
  EXPECT_NE(log.find("loss scaling: on the device"), std::string::npos) << log;
  EXPECT_NE(log.find("step 3: inf/NaN gradients, step skipped; loss scale now 2.09715e+06"),
            std::string::npos)
      << log;
  return log;
}

TEST_F(TrainGraph, Fp16WithTheDeviceLossScalerReplaysEqualEagerStepsBitwise) {
  REQUIRE_GPU();
  expect_graph_equals_eager(config("[optim]\nlr = 0.05\n"), kFp16FromAnOverflowingScale);
  for (const char* graph : {"true", "false"}) {
    const std::string log = fp16_run_log(dir_, graph);
    EXPECT_NE(log.find("step 1: inf/NaN gradients, step skipped; loss scale now 8.38861e+06"),
              std::string::npos)
        << log;
  }
}

// fp16 with AdamW: the same, and AdamW's bias correction counts only the applied steps, on the device:
// every parameter's checkpointed "step" count is 50 less the skipped steps the log reports.
TEST_F(TrainGraph, Fp16AdamWWithTheDeviceLossScalerReplaysEqualEagerStepsBitwise) {
  REQUIRE_GPU();
  expect_graph_equals_eager(config("[optim]\nname = \"adamw\"\nlr = 0.002\nweight_decay = 0.05\n"),
                            kFp16FromAnOverflowingScale);
  for (const char* graph : {"true", "false"}) {
    const std::string log = fp16_run_log(dir_, graph);
    int skipped = 0;
    for (size_t at = log.find("step skipped"); at != std::string::npos; at = log.find("step skipped", at + 1))
      ++skipped;
    EXPECT_GE(skipped, 3) << log;
    const auto state =
        load_safetensors((dir_ / graph / "checkpoints" / "step-00000050" / "optimizer.safetensors").string());
    int counts = 0;
    for (const auto& [name, t] : state) {
      if (name.rfind("step.", 0) != 0) continue;
      EXPECT_EQ(t.item(), 50 - skipped) << graph << " " << name;
      ++counts;
    }
    EXPECT_GT(counts, 10) << graph;
  }
}

// The weight average inside the captured step: fp16's device loss scaler skips steps 1-3 (the average
// skips them on the flag), every_steps = 3 reads the gate staged before each replay, the warm-up reads
// its count on the device; the last average equals the eager run's byte for byte.
TEST_F(TrainGraph, TheAverageReplaysEqualEagerUpdatesBitwise) {
  REQUIRE_GPU();
  expect_graph_equals_eager(config("[optim]\nlr = 0.05\n[ema]\nenabled = true\ndecay = 0.99\nwarmup = true\n"
                                   "every_steps = 3\n"),
                            kFp16FromAnOverflowingScale);
  const fs::path file = fs::path("checkpoints") / "step-00000050" / "ema.safetensors";
  const std::string graphed = read_file(dir_ / "true" / file);
  EXPECT_FALSE(graphed.empty());
  EXPECT_EQ(graphed, read_file(dir_ / "false" / file));
}

// LAMB (its global norm on the device) and LARS with layer-wise LR decay, captured.
TEST_F(TrainGraph, LambAndLarsReplaysEqualEagerStepsBitwise) {
  REQUIRE_GPU();
  expect_graph_equals_eager(config("[optim]\nname = \"lamb\"\nlr = 0.005\nweight_decay = 0.02\n"
                                   "layer_decay = 0.8\n"),
                            "");
  fs::remove_all(dir_ / "true");
  fs::remove_all(dir_ / "false");
  expect_graph_equals_eager(config("[optim]\nname = \"lars\"\nlr = 0.5\nweight_decay = 1e-4\n"
                                   "trust_coeff = 0.02\nlayer_decay = 0.8\n"),
                            "");
}

// optim.clip_grad_norm inside the captured step: the norm, the coefficient and the scaling stay on the
// device (clip_grad_norm_on_device), after fp16's device loss scaler unscales (its first steps overflow:
// a non-finite norm, and the skipped step), and with bf16 and SGD.
TEST_F(TrainGraph, ClippedStepsReplayEqualEagerStepsBitwise) {
  REQUIRE_GPU();
  expect_graph_equals_eager(config("[optim]\nname = \"adamw\"\nlr = 0.002\nclip_grad_norm = 0.5\n"),
                            kFp16FromAnOverflowingScale);
  for (const char* graph : {"true", "false"}) fp16_run_log(dir_, graph);
  fs::remove_all(dir_ / "true");
  fs::remove_all(dir_ / "false");
  expect_graph_equals_eager(config("[optim]\nlr = 0.05\nclip_grad_norm = 0.1\n"),
                            " --set train.precision=bf16");
}

// Stochastic depth inside the captured step: ConvNeXt's drop-path masks are drawn on the host and staged
// at one device address before each step (DropPathStager), so each replay drops the samples its eager
// twin drops (a mask drawn inside the capture would be replayed, or read from reused host memory).
TEST_F(TrainGraph, DropPathReplaysEqualEagerStepsBitwise) {
  REQUIRE_GPU();
  expect_graph_equals_eager(
      config("[optim]\nname = \"adamw\"\nlr = 0.002\n"),
      " --set model.name=convnext --set 'model.depths=[1,2]' --set 'model.widths=[8,16]'"
      " --set model.stem_patch=2 --set model.drop_path=0.5 --set train.precision=bf16");
}

// model.freeze_epochs: the graph captured while conv1 and bn1 are frozen is dropped when they start to
// train (epoch 3, step 21); that step runs eagerly (allocating their momentum) and step 22 is captured
// anew. Losses, weights and optimizer state equal the eager run's bit for bit.
TEST_F(TrainGraph, AFreezeEndingMidRunIsRecapturedAndEqualsEagerStepsBitwise) {
  REQUIRE_GPU();
  expect_graph_equals_eager(config("[optim]\nlr = 0.05\n"),
                            " --set model.freeze=[\\\"conv1\\\",\\\"bn1\\\"] --set model.freeze_epochs=2");
  const std::string log = read_file(dir_ / "true" / "train.log");
  EXPECT_NE(log.find("freeze: ends at epoch 3"), std::string::npos) << log;
  EXPECT_NE(log.find("CUDA graph: dropped with the old set of trained parameters"), std::string::npos) << log;
  EXPECT_NE(log.find("CUDA graph: step 22 captured"), std::string::npos) << log;
}

// On a GPU the loss is read back one step late (replayed or eager): a diverging run still stops at a
// non-finite loss with the step and the hint, and writes no final checkpoint of NaN weights.
TEST_F(TrainGraph, ANanLossStopsTheRunWithAndWithoutTheGraph) {
  REQUIRE_GPU();
  const std::string cfg = config("[optim]\nlr = 1e12\n");
  for (const char* graph : {"true", "false"}) {
    const auto r =
        run_trainer("train " + cfg + kSamples + " --set train.device=cuda --set train.cuda_graph=" + graph +
                    " --set train.run_dir=" + run_dir(graph));
    EXPECT_EQ(r.exit_code, 1) << graph << "\n" << r.output;
    EXPECT_TRUE(r.output.find("loss is NaN at step") != std::string::npos ||
                r.output.find("loss is infinite at step") != std::string::npos)
        << graph << "\n"
        << r.output;
    EXPECT_NE(r.output.find("training diverged. HINT: lower optim.lr"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(dir_ / graph / "checkpoints" / "final.safetensors")) << graph;
  }
}

TEST_F(TrainGraph, RunsTheGraphCannotTakeRunEagerlyAndSaySo) {
  REQUIRE_GPU();
  const std::string cfg = config("[optim]\nlr = 0.05\n");
  const auto r =
      run_trainer("train " + cfg + kSamples +
                  " --set train.device=cuda --set train.precision=fp16 --set train.grad_accum_steps=2"
                  " --set train.max_steps=5 --set train.run_dir=" +
                  run_dir("fp16"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("CUDA graph: off, every step runs eagerly (train.grad_accum_steps > 1"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("CUDA graph: step"), std::string::npos) << r.output;  // nothing captured
}

}  // namespace
}  // namespace trainer
