// Multi-process training on this machine's CPU: ranks started by hand with torchrun's variables, as a
// launcher would, on loopback.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "app/run_outputs.h"
#include "app/trainer_process.h"
#include "dist/multi_process.h"
#include "metrics/child_process.h"
#include "metrics/run_csv_util.h"
#include "nn/safetensors.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

using RankResult = trainer::testing::RunResult;
using trainer::testing::ChildProcess;
using trainer::testing::number_after;
using trainer::testing::read_file;

using trainer::testing::free_port;  // below the kernel's ephemeral range, so parallel tests do not collide

class DistributedTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("trainer_dist_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    port_ = free_port();
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write_config(const std::string& body) {
    const fs::path path = dir_ / "cfg.toml";
    std::ofstream(path) << body;
    return path.string();
  }

  // trainer::testing::run_ranks in this test's directory, on its port.
  std::vector<RankResult> run_ranks(const std::vector<std::string>& rank_args,
                                    const std::vector<std::string>& prefix = {}) {
    return trainer::testing::run_ranks(dir_, port_, rank_args, prefix);
  }

  void expect_two_rank_resume_after_sigterm_is_bit_exact(const std::string& overrides);

  // The rows of run directory `name`'s train_steps.csv (rank 0's), split into their fields
  // (step, epoch, loss, lr), without the header and the wall_time column.
  std::vector<std::vector<std::string>> train_steps(const std::string& name) {
    std::istringstream csv(trainer::testing::without_wall_time(read_file(dir_ / name / "train_steps.csv")));
    std::vector<std::vector<std::string>> rows;
    std::string line;
    std::getline(csv, line);  // header
    while (std::getline(csv, line)) {
      std::vector<std::string>& fields = rows.emplace_back();
      std::istringstream in(line);
      for (std::string v; std::getline(in, v, ',');) fields.push_back(v);
    }
    return rows;
  }

  fs::path dir_;
  int port_ = 0;
};

const char* kMlpConfig =
    "[model]\nname = \"mlp\"\nin_channels = 1\n"
    "[data]\ndataset = \"synthetic\"\nsynthetic_samples = 512\nsynthetic_image_size = 12\n"
    "[train]\nepochs = 2\n"
    "[optim]\nlr = 0.05\nweight_decay = 0.0\n"
    "[checkpoint]\nevery_epochs = 0\n";

// Caffe's rule: N ranks with batch B equal one rank with batch N x B (no BatchNorm, no augmentation),
// because every global batch holds the same samples and gradients are averaged.
TEST_F(DistributedTrain, TwoRanksEqualOneRankWithTwiceTheBatch) {
  const std::string cfg = write_config(kMlpConfig);
  auto one = run_ranks(
      {"train " + cfg + " --set data.batch_size=64 --set train.run_dir=" + (dir_ / "one").string()});
  ASSERT_EQ(one[0].exit_code, 0) << one[0].output;
  const std::string two_dir = (dir_ / "two").string();
  auto two = run_ranks({"train " + cfg + " --set data.batch_size=32 --set train.run_dir=" + two_dir,
                        "train " + cfg + " --set data.batch_size=32 --set train.run_dir=" + two_dir});
  ASSERT_EQ(two[0].exit_code, 0) << two[0].output << two[1].output;
  ASSERT_EQ(two[1].exit_code, 0) << two[1].output;
  EXPECT_NE(read_file(dir_ / "two/summary.json").find("\"world_size\": 2"), std::string::npos);
  EXPECT_NE(read_file(dir_ / "two/summary.json").find("\"steps\": 16"), std::string::npos);
  auto a = load_safetensors((dir_ / "one/checkpoints/final.safetensors").string());
  auto b = load_safetensors((dir_ / "two/checkpoints/final.safetensors").string());
  ASSERT_EQ(a.size(), b.size());
  for (auto& [name, t] : a) {
    const auto x = t.to_vector<double>(), y = b.at(name).to_vector<double>();
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
    EXPECT_LT(worst, 1e-5) << name;
  }
  // Evaluation is exact: each test sample counted once over the two shards.
  EXPECT_NE(two[0].output.find("(102 images"), std::string::npos) << two[0].output;
  // The train loss is the mean over both ranks' batches (equal halves of the 1-rank batch), not rank 0's.
  auto train_loss = [&](const char* run) {
    const std::string json = read_file(dir_ / run / "summary.json");
    const size_t at = json.find("\"final_train_loss\": ");
    return at == std::string::npos ? -1.0 : std::stod(json.substr(at + 20));
  };
  ASSERT_GT(train_loss("one"), 0.0);
  EXPECT_NEAR(train_loss("two"), train_loss("one"), 1e-5 * train_loss("one"));
}

TEST_F(DistributedTrain, ThreeRanksEqualOneRankWithThreeTimesTheBatch) {
  const std::string cfg = write_config(std::string(kMlpConfig) + "\n");
  auto one =
      run_ranks({"train " + cfg + " --set data.batch_size=96 --set train.epochs=4 --set train.run_dir=" +
                 (dir_ / "one").string()});
  ASSERT_EQ(one[0].exit_code, 0) << one[0].output;
  const std::string three =
      " --set data.batch_size=32 --set train.epochs=4 --set train.run_dir=" + (dir_ / "three").string();
  auto r = run_ranks({"train " + cfg + three, "train " + cfg + three, "train " + cfg + three});
  for (const auto& rank : r) ASSERT_EQ(rank.exit_code, 0) << rank.output;
  EXPECT_NE(read_file(dir_ / "three/summary.json").find("\"steps\": 20"), std::string::npos);
  auto a = load_safetensors((dir_ / "one/checkpoints/final.safetensors").string());
  auto b = load_safetensors((dir_ / "three/checkpoints/final.safetensors").string());
  for (auto& [name, t] : a) {
    const auto x = t.to_vector<double>(), y = b.at(name).to_vector<double>();
    double worst = 0, scale = 1e-12;
    for (size_t i = 0; i < x.size(); ++i) {
      worst = std::max(worst, std::abs(x[i] - y[i]));
      scale = std::max(scale, std::abs(x[i]));
    }
    EXPECT_LT(worst / scale, 1e-5) << name;
  }
}

// Snapshot + restore equals an uninterrupted run with 2 ranks too: SIGTERM at the same step on both
// ranks (as a launcher forwards it) writes one checkpoint (rank 0), and --resume auto on both ranks
// continues mid-epoch to bit-identical weights and losses. `overrides` are added to every command.
void DistributedTrain::expect_two_rank_resume_after_sigterm_is_bit_exact(const std::string& overrides) {
  const std::string cfg = write_config(
      // No BatchNorm: per-rank running statistics are not part of the checkpoint (rank 0's, averaged,
      // are), so with BN the final running stats match an uninterrupted run only up to rounding.
      "[model]\nname = \"mlp\"\nin_channels = 1\n"
      "[data]\ndataset = \"synthetic\"\nsynthetic_samples = 512\nsynthetic_image_size = 12\nbatch_size = 32\n"
      "hflip = true\n[train]\nepochs = 2\n[checkpoint]\nevery_steps = 3\n");
  const std::string full = overrides + " --set train.run_dir=" + (dir_ / "full").string();
  auto a = run_ranks({"train " + cfg + full, "train " + cfg + full});
  ASSERT_EQ(a[0].exit_code, 0) << a[0].output;
  const std::string cut = overrides + " --set train.run_dir=" + (dir_ / "cut").string();
  const std::string sig = "TRAINER_TEST_SIGTERM_AT_STEP=11";
  auto b = run_ranks({"train " + cfg + cut, "train " + cfg + cut}, {sig, sig});
  EXPECT_EQ(b[0].exit_code, 143) << b[0].output;
  EXPECT_EQ(b[1].exit_code, 143) << b[1].output;
  port_ = free_port();
  auto c = run_ranks({"train " + cfg + cut + " --resume auto", "train " + cfg + cut + " --resume auto"});
  ASSERT_EQ(c[0].exit_code, 0) << c[0].output;
  ASSERT_EQ(c[1].exit_code, 0) << c[1].output;
  EXPECT_NE(c[0].output.find("resumed from"), std::string::npos) << c[0].output;
  EXPECT_EQ(trainer::testing::without_wall_time(read_file(dir_ / "full/train_steps.csv")),
            trainer::testing::without_wall_time(read_file(dir_ / "cut/train_steps.csv")));
  EXPECT_EQ(read_file(dir_ / "full/checkpoints/final.safetensors"),
            read_file(dir_ / "cut/checkpoints/final.safetensors"));
}

// The same with a real kill: rank 0 dies by SIGKILL (test hook) while writing the step-12 checkpoint,
// after its files are complete and before the rename; rank 1 stops when rank 0 is gone. Both ranks
// resume from step-9, mid-epoch, and end bit-identical to the uninterrupted run.
TEST_F(DistributedTrain, TwoRanksKilledWhileWritingACheckpointResumeBitExact) {
  const std::string cfg = write_config(
      "[model]\nname = \"mlp\"\nin_channels = 1\n"
      "[data]\ndataset = \"synthetic\"\nsynthetic_samples = 512\nsynthetic_image_size = 12\nbatch_size = 32\n"
      "hflip = true\n[train]\nepochs = 2\n[checkpoint]\nevery_steps = 3\n[dist]\ntimeout_seconds = 20\n");
  const std::string full = " --set train.run_dir=" + (dir_ / "full").string();
  auto a = run_ranks({"train " + cfg + full, "train " + cfg + full});
  ASSERT_EQ(a[0].exit_code, 0) << a[0].output;
  const std::string cut = " --set train.run_dir=" + (dir_ / "cut").string();
  const std::string crash = "TRAINER_TEST_CRASH_BEFORE_RENAME=12";
  port_ = free_port();
  auto b = run_ranks({"train " + cfg + cut, "train " + cfg + cut}, {crash, crash});
  EXPECT_EQ(b[0].exit_code, 137) << b[0].output;  // SIGKILL
  EXPECT_NE(b[1].exit_code, 0) << b[1].output;
  // Rank 1 has the same crash hook but never writes a checkpoint, so it is not killed by it: it stops
  // because rank 0 is gone.
  EXPECT_NE(b[1].exit_code, 137) << b[1].output;
  EXPECT_TRUE(std::filesystem::exists(dir_ / "cut/checkpoints/.step-00000012.tmp"));
  port_ = free_port();
  auto c = run_ranks({"train " + cfg + cut + " --resume auto", "train " + cfg + cut + " --resume auto"});
  ASSERT_EQ(c[0].exit_code, 0) << c[0].output;
  ASSERT_EQ(c[1].exit_code, 0) << c[1].output;
  EXPECT_NE(c[0].output.find("step-00000009: step 9, epoch 2, batch 1 of the epoch"), std::string::npos)
      << c[0].output;
  EXPECT_EQ(trainer::testing::without_wall_time(read_file(dir_ / "full/train_steps.csv")),
            trainer::testing::without_wall_time(read_file(dir_ / "cut/train_steps.csv")));
  EXPECT_EQ(read_file(dir_ / "full/checkpoints/final.safetensors"),
            read_file(dir_ / "cut/checkpoints/final.safetensors"));
}

// optim.lr_scaling = "linear" (the seed guides' "new_lr = base_lr x num_gpus"): the learning rate the
// run trains with, as rank 0's train_steps.csv logs it, scales with the global batch, that is with
// the ranks and with gradient accumulation: 0.05 at 32 images (base_batch_size), 0.1 on 2 ranks,
// 0.2 on 2 ranks accumulating 2 micro-batches.
TEST_F(DistributedTrain, LinearLrScalingFollowsTheGlobalBatch) {
  const std::string cfg = write_config(
      "[model]\nname = \"mlp\"\nin_channels = 1\n"
      "[data]\ndataset = \"synthetic\"\nsynthetic_samples = 512\nsynthetic_image_size = 12\nbatch_size = 32\n"
      "[train]\nepochs = 1\nmax_steps = 2\n[optim]\nlr = 0.05\nlr_scaling = \"linear\"\nbase_batch_size = "
      "32\n"
      "[schedule]\nname = \"constant\"\n[checkpoint]\nevery_epochs = 0\n");
  // The learning rate of the run's first step.
  auto first_lr = [&](const std::string& name) {
    const auto rows = train_steps(name);
    return rows.empty() || rows[0].size() != 4 ? -1.0 : std::stod(rows[0][3]);
  };
  auto run = [&](const std::string& name, int ranks, int accumulate) {
    const std::string args = "train " + cfg + " --set train.run_dir=" + (dir_ / name).string() +
                             " --set train.grad_accum_steps=" + std::to_string(accumulate);
    port_ = free_port();
    const auto r = run_ranks(std::vector<std::string>(static_cast<size_t>(ranks), args));
    for (const RankResult& rank : r) EXPECT_EQ(rank.exit_code, 0) << rank.output;
  };
  run("one", 1, 1);
  run("two", 2, 1);
  run("two_accumulating", 2, 2);
  EXPECT_NEAR(first_lr("one"), 0.05, 1e-9);
  EXPECT_NEAR(first_lr("two"), 0.1, 1e-9);
  EXPECT_NEAR(first_lr("two_accumulating"), 0.2, 1e-9);
}

// The loop reshuffles every epoch (the seed guides' forgotten sampler.set_epoch): with a learning rate
// too small to move the weights, a step's loss depends only on which samples its batch holds, so the
// second epoch's losses repeat the first's exactly when data.shuffle = false and differ when the
// sampler draws a new order. On 2 ranks, as the sampler's epoch is what every rank must share.
TEST_F(DistributedTrain, EveryEpochIsShuffledAnew) {
  const std::string cfg = write_config(
      "[model]\nname = \"mlp\"\nin_channels = 1\n"
      "[data]\ndataset = \"synthetic\"\nsynthetic_samples = 256\nsynthetic_image_size = 12\nbatch_size = 32\n"
      "[train]\nepochs = 2\n[optim]\nlr = 1e-12\nweight_decay = 0.0\nmomentum = 0.0\n"
      "[schedule]\nname = \"constant\"\n[checkpoint]\nevery_epochs = 0\n");
  // Rank 0's logged losses of each epoch, as text.
  auto losses_by_epoch = [&](const std::string& name) {
    std::map<std::string, std::vector<std::string>> by_epoch;
    for (const std::vector<std::string>& f : train_steps(name))
      if (f.size() == 4) by_epoch[f[1]].push_back(f[2]);
    return by_epoch;
  };
  for (const bool shuffle : {false, true}) {
    const std::string name = shuffle ? "shuffled" : "in_order";
    const std::string args = "train " + cfg + " --set train.run_dir=" + (dir_ / name).string() +
                             " --set data.shuffle=" + (shuffle ? "true" : "false");
    port_ = free_port();
    for (const RankResult& r : run_ranks({args, args})) ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto epochs = losses_by_epoch(name);
    ASSERT_EQ(epochs.size(), 2u) << read_file(dir_ / name / "train_steps.csv");
    const std::vector<std::string>& first = epochs.begin()->second;
    const std::vector<std::string>& second = std::next(epochs.begin())->second;
    ASSERT_EQ(first.size(), 4u);  // 256 samples / (2 ranks x 32)
    ASSERT_EQ(second.size(), first.size());
    if (shuffle)
      EXPECT_NE(first, second);
    else
      EXPECT_EQ(first, second);
  }
}

// A checkpoint written by 2 ranks, mid-epoch (SIGTERM after step 11: epoch 2, 192 of 512 samples
// seen), resumed at another world size. Refused unless checkpoint.allow_world_size_change; then the
// 320 samples not yet seen continue in the epoch's global order, re-sharded. On 1 rank with twice the
// batch every global batch holds the same samples as in the 2-rank run, so the weights match an
// uninterrupted 2-rank run up to summation order; on 3 ranks the epoch ends after the 320 samples.
TEST_F(DistributedTrain, ResumeOnOneOrThreeRanksContinuesWithTheUnseenSamples) {
  const std::string cfg = write_config(
      "[model]\nname = \"mlp\"\nin_channels = 1\n"
      "[data]\ndataset = \"synthetic\"\nsynthetic_samples = 512\nsynthetic_image_size = 12\nbatch_size = 32\n"
      "hflip = true\n[train]\nepochs = 2\n[optim]\nweight_decay = 0.0\n[checkpoint]\nevery_epochs = 0\n");
  const std::string full = " --set train.run_dir=" + (dir_ / "full").string();
  auto a = run_ranks({"train " + cfg + full, "train " + cfg + full});
  ASSERT_EQ(a[0].exit_code, 0) << a[0].output;
  const std::string sig = "TRAINER_TEST_SIGTERM_AT_STEP=11";
  for (const char* name : {"one", "three"}) {
    const std::string cut = " --set train.run_dir=" + (dir_ / name).string();
    port_ = free_port();
    auto b = run_ranks({"train " + cfg + cut, "train " + cfg + cut}, {sig, sig});
    ASSERT_EQ(b[0].exit_code, 143) << b[0].output;
  }
  port_ = free_port();
  const std::string one = " --set train.run_dir=" + (dir_ / "one").string() + " --set data.batch_size=64";
  auto refused = run_ranks({"train " + cfg + one + " --resume auto"});
  EXPECT_NE(refused[0].exit_code, 0);
  EXPECT_NE(refused[0].output.find("checkpoint.allow_world_size_change"), std::string::npos)
      << refused[0].output;
  auto r1 =
      run_ranks({"train " + cfg + one + " --resume auto --set checkpoint.allow_world_size_change=true"});
  ASSERT_EQ(r1[0].exit_code, 0) << r1[0].output;
  EXPECT_NE(
      r1[0].output.find("world size 2 -> 1: epoch 2 continues after 192 of its 512 samples; the 320 not yet "
                        "seen keep their global order"),
      std::string::npos)
      << r1[0].output;
  EXPECT_NE(read_file(dir_ / "one/summary.json").find("\"steps\": 16"), std::string::npos);
  auto x = load_safetensors((dir_ / "full/checkpoints/final.safetensors").string());
  auto y = load_safetensors((dir_ / "one/checkpoints/final.safetensors").string());
  for (auto& [name, t] : x) {
    const auto p = t.to_vector<double>(), q = y.at(name).to_vector<double>();
    double worst = 0;
    for (size_t i = 0; i < p.size(); ++i) worst = std::max(worst, std::abs(p[i] - q[i]));
    EXPECT_LT(worst, 1e-5) << name;
  }

  port_ = free_port();
  const std::string three = " --set train.run_dir=" + (dir_ / "three").string() +
                            " --resume auto --set checkpoint.allow_world_size_change=true";
  auto r3 = run_ranks({"train " + cfg + three, "train " + cfg + three, "train " + cfg + three});
  for (const auto& rank : r3) ASSERT_EQ(rank.exit_code, 0) << rank.output;
  EXPECT_NE(
      r3[0].output.find("world size 2 -> 3: epoch 2 continues after 192 of its 512 samples; the 320 not yet "
                        "seen"),
      std::string::npos)
      << r3[0].output;
  // 704 samples seen = step 7 of 96-sample global batches; the 320 unseen samples are 106 per rank
  // (data.drop_last: the sampler drops 2, the loader the last partial batch), 3 batches of 32: steps
  // 8..10, and the epoch (the run) ends.
  EXPECT_NE(r3[0].output.find("step 11 -> 7"), std::string::npos) << r3[0].output;
  EXPECT_NE(read_file(dir_ / "three/summary.json").find("\"steps\": 10"), std::string::npos)
      << read_file(dir_ / "three/summary.json");
}

TEST_F(DistributedTrain, TwoRankResumeAfterSigtermIsBitExact) {
  expect_two_rank_resume_after_sigterm_is_bit_exact("");
}

// ZeRO acceptance: resuming from a checkpoint of sharded optimizer state (gathered to rank 0, which
// writes it) is bit-exact, for both stages, with AdamW's two moments.
TEST_F(DistributedTrain, ZeroStage1ResumeAfterSigtermIsBitExact) {
  expect_two_rank_resume_after_sigterm_is_bit_exact(
      " --set dist.zero_stage=1 --set optim.name=adamw --set optim.lr=0.002");
}
TEST_F(DistributedTrain, ZeroStage2ResumeAfterSigtermIsBitExact) {
  expect_two_rank_resume_after_sigterm_is_bit_exact(
      " --set dist.zero_stage=2 --set optim.name=adamw --set optim.lr=0.002");
}

// The weight average (ema.enabled) on two ranks with ZeRO stage 1: every rank keeps it whole, rank 0
// writes it, and the resumed run's last average equals the uninterrupted run's byte for byte.
TEST_F(DistributedTrain, TwoRankResumeWithTheAverageAndZeroIsBitExact) {
  expect_two_rank_resume_after_sigterm_is_bit_exact(
      " --set dist.zero_stage=1 --set optim.name=adamw --set optim.lr=0.002 --set ema.enabled=true"
      " --set ema.decay=0.9 --set ema.warmup=true");
  const auto last_average = [&](const std::string& run) {
    fs::path newest;
    for (const auto& d : fs::directory_iterator(dir_ / run / "checkpoints"))
      if (d.path().filename().string().starts_with("step-") && d.path() > newest) newest = d.path();
    return read_file(newest / "ema.safetensors");
  };
  const std::string full = last_average("full");
  EXPECT_FALSE(full.empty());
  EXPECT_EQ(full, last_average("cut"));
}

// ZeRO acceptance through the training loop: 20 steps with stages 1 and 2 end at stage 0's weights
// (relative difference < 1e-6) on 2 and 3 ranks, SGD with momentum and weight decay, and AdamW, with
// gradient accumulation and clipping.
TEST_F(DistributedTrain, ZeroStagesEndAtStageZerosWeights) {
  const std::string cfg = write_config(
      "[model]\nname = \"mlp\"\nin_channels = 1\n"
      "[data]\ndataset = \"synthetic\"\nsynthetic_samples = 960\nsynthetic_image_size = 12\nbatch_size = 8\n"
      "[train]\nepochs = 1\nmax_steps = 20\ngrad_accum_steps = 2\neval_every_epochs = 0\n"
      "[optim]\nclip_grad_norm = 0.5\n[checkpoint]\nevery_epochs = 0\n");
  for (int world : {2, 3}) {
    for (const std::string optim :
         {" --set optim.name=sgd --set optim.lr=0.05 --set optim.weight_decay=0.001",
          " --set optim.name=adamw --set optim.lr=0.002"}) {
      std::vector<std::map<std::string, Tensor>> weights;
      for (int stage = 0; stage <= 2; ++stage) {
        const std::string run = (dir_ / ("w" + std::to_string(world) + "s" + std::to_string(stage))).string();
        fs::remove_all(run);
        port_ = free_port();
        const std::string args = "train " + cfg + optim + " --set dist.zero_stage=" + std::to_string(stage) +
                                 " --set train.run_dir=" + run;
        auto r = run_ranks(std::vector<std::string>(world, args));
        for (const auto& rank : r) ASSERT_EQ(rank.exit_code, 0) << rank.output;
        EXPECT_NE(read_file(run + "/summary.json").find("\"steps\": 20"), std::string::npos);
        weights.push_back(load_safetensors(run + "/checkpoints/final.safetensors"));
      }
      for (int stage = 1; stage <= 2; ++stage) {
        for (auto& [name, t] : weights[0]) {
          const auto x = t.to_vector<double>(), y = weights[stage].at(name).to_vector<double>();
          double worst = 0, scale = 1e-30;
          for (size_t i = 0; i < x.size(); ++i) {
            worst = std::max(worst, std::abs(x[i] - y[i]));
            scale = std::max(scale, std::abs(x[i]));
          }
          EXPECT_LT(worst / scale, 1e-6) << world << " ranks, stage " << stage << optim << ": " << name;
        }
      }
    }
  }
}

// ZeRO acceptance: the optimizer state each rank measures (the bytes of its shard tensors, logged at
// start-up) is what `trainer plan` reports for the configured stage (1 and 2), and 1/N of the unsharded
// state.
TEST_F(DistributedTrain, ZeroOptimizerStatePerRankIsWhatPlanReports) {
  const std::string cfg = write_config(std::string(kMlpConfig) + "\n");
  for (const auto& [stage, world] : std::vector<std::pair<int, int>>{{1, 2}, {1, 3}, {2, 2}, {2, 3}}) {
    const std::string set =
        " --set optim.name=adamw --set dist.zero_stage=" + std::to_string(stage) + " --set train.max_steps=1";
    const std::string row = "ZeRO-" + std::to_string(stage);
    auto plan = run_ranks({"plan " + cfg + set + " --procs " + std::to_string(world)});
    ASSERT_EQ(plan[0].exit_code, 0) << plan[0].output;
    const long long reported = number_after(
        plan[0].output, "dist.zero_stage = " + std::to_string(stage) + " (" + row + "): optimizer state ");
    const long long unsharded = number_after(plan[0].output, "bytes per rank, ");
    ASSERT_GT(reported, 0) << plan[0].output;
    EXPECT_NE(plan[0].output.find(row + " "), std::string::npos);
    EXPECT_NE(plan[0].output.find("<- dist.zero_stage"), std::string::npos) << plan[0].output;
    // 1/N, up to the padding of the flat parameter vector (< N elements of 2 moments of 4 bytes);
    // stage 2 pads each gradient bucket (a few for this model).
    EXPECT_GE(reported * world, unsharded);
    EXPECT_LT(reported * world - unsharded, world * 8 * (stage == 2 ? 8 : 1));

    port_ = free_port();
    const std::string run = (dir_ / ("plan" + std::to_string(stage) + std::to_string(world))).string();
    auto r = run_ranks(std::vector<std::string>(world, "train " + cfg + set + " --set train.run_dir=" + run));
    for (int rank = 0; rank < world; ++rank) {
      ASSERT_EQ(r[rank].exit_code, 0) << r[rank].output;
      const std::string log =
          read_file(run + (rank == 0 ? "/train.log" : "/train.rank" + std::to_string(rank) + ".log"));
      EXPECT_EQ(number_after(log, "optimizer state "), reported) << "rank " << rank << "\n" << log;
      EXPECT_EQ(number_after(log, "bytes on this rank ("), unsharded) << log;
    }
  }
}

// A rank stuck outside any collective (its data loader hangs before step 2): the other rank's
// all-reduce times out, and its error says where every rank is, through the heartbeat, instead of
// only "rank 1 did not arrive".
TEST_F(DistributedTrain, ATimedOutCollectiveSaysWhereEachRankIs) {
  const std::string cfg = write_config(std::string(kMlpConfig) + "\n");
  const std::string args =
      "train " + cfg + " --set dist.timeout_seconds=2 --set train.run_dir=" + (dir_ / "r").string();
  auto r = run_ranks({args, args}, {"TRAINER_TEST_STALL=1:1:6", "TRAINER_TEST_STALL=1:1:6"});
  EXPECT_EQ(r[0].exit_code, 1) << r[0].output;
  EXPECT_NE(r[0].output.find("timed out after 2 s on rank 0: rank(s) 1 did not arrive"), std::string::npos)
      << r[0].output;
  EXPECT_NE(r[0].output.find("what each rank last reported"), std::string::npos) << r[0].output;
  EXPECT_NE(r[0].output.find("rank 1: step 1, in data_wait for"), std::string::npos) << r[0].output;
  EXPECT_NE(r[0].output.find("alive, but not in a collective"), std::string::npos) << r[0].output;
}

// Diverging on 2 ranks (2 steps per epoch: the weights are NaN by the first evaluation): every rank
// stops with "training diverged" and a hint, from the loss check or from evaluation (which used to fail
// in ROC-AUC with "a score is NaN"), and none waits for the other.
TEST_F(DistributedTrain, ANanLossStopsEveryRank) {
  const std::string cfg = write_config(std::string(kMlpConfig) + "\n");
  const std::string args =
      "train " + cfg + " --set optim.lr=1e12 --set train.run_dir=" + (dir_ / "nan").string();
  auto r = run_ranks({args, args});
  for (int rank : {0, 1}) {
    EXPECT_EQ(r[rank].exit_code, 1) << r[rank].output;
    EXPECT_NE(r[rank].output.find("training diverged"), std::string::npos) << r[rank].output;
    EXPECT_NE(r[rank].output.find("HINT: lower optim.lr"), std::string::npos) << r[rank].output;
  }
}

TEST_F(DistributedTrain, RanksWithDifferentConfigsStopAtStartNamingTheKey) {
  const std::string cfg = write_config(kMlpConfig);
  auto r = run_ranks({"train " + cfg + " --set train.run_dir=" + (dir_ / "x").string(),
                      "train " + cfg + " --set optim.lr=0.2 --set train.run_dir=" + (dir_ / "x").string()});
  EXPECT_NE(r[0].exit_code, 0);
  EXPECT_NE(r[1].exit_code, 0);
  for (const auto& rank : r) EXPECT_NE(rank.output.find("optim.lr"), std::string::npos) << rank.output;
}

TEST_F(DistributedTrain, RanksWithDifferentDataStopAtStart) {
  const std::string cfg = write_config(kMlpConfig);
  auto r = run_ranks({"train " + cfg + " --set train.run_dir=" + (dir_ / "y").string(),
                      "train " + cfg + " --set train.seed=0 --set train.run_dir=" + (dir_ / "y").string() +
                          " --set data.synthetic_classes=9"});
  EXPECT_NE(r[0].exit_code, 0);
  EXPECT_NE(r[1].exit_code, 0);
  EXPECT_NE(r[0].output.find("dataset fingerprint"), std::string::npos) << r[0].output;
}

// The seed guides' "load the checkpoint on every rank": a rank that resumes from another checkpoint,
// or starts afresh (no --resume, or a node that cannot see the checkpoint directory), stops every
// rank at the start, naming each rank's resume point, instead of training from other weights.
TEST_F(DistributedTrain, RanksResumingFromDifferentPointsStopAtStart) {
  const std::string cfg = write_config(
      "[model]\nname = \"mlp\"\nin_channels = 1\n"
      "[data]\ndataset = \"synthetic\"\nsynthetic_samples = 512\nsynthetic_image_size = 12\nbatch_size = 32\n"
      "[train]\nepochs = 2\n[checkpoint]\nevery_steps = 3\n[dist]\ntimeout_seconds = 60\n");
  const std::string run = " --set train.run_dir=" + (dir_ / "run").string();
  auto a = run_ranks({"train " + cfg + run, "train " + cfg + run});
  ASSERT_EQ(a[0].exit_code, 0) << a[0].output;
  const std::string history = trainer::testing::without_wall_time(read_file(dir_ / "run/train_steps.csv"));
  const fs::path ckpts = dir_ / "run/checkpoints";
  ASSERT_TRUE(fs::exists(ckpts / "step-00000012")) << a[0].output;
  ASSERT_TRUE(fs::exists(ckpts / "step-00000015")) << a[0].output;
  const std::string at12 = " --resume " + (ckpts / "step-00000012").string();
  const std::string at15 = " --resume " + (ckpts / "step-00000015").string();
  const std::vector<std::vector<std::string>> cases = {
      {"train " + cfg + run + at15, "train " + cfg + run + at12},  // another checkpoint
      {"train " + cfg + run + at15, "train " + cfg + run},         // a fresh start
  };
  for (const auto& ranks : cases) {
    port_ = free_port();
    auto r = run_ranks(ranks);
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_NE(r[rank].exit_code, 0) << r[rank].output;
      EXPECT_NE(r[rank].output.find("resume point"), std::string::npos) << r[rank].output;
      EXPECT_NE(r[rank].output.find("step 15 of checkpoint"), std::string::npos) << r[rank].output;
      EXPECT_NE(r[rank].output.find("every rank must resume from the same checkpoint"), std::string::npos)
          << r[rank].output;
    }
    // Nothing was written before the ranks agreed: rank 0's step log still holds all 16 steps.
    EXPECT_EQ(trainer::testing::without_wall_time(read_file(dir_ / "run/train_steps.csv")), history);
  }
  // A rank that cannot load its checkpoint (a path its node does not have) stops every rank at once,
  // the others naming why, instead of leaving them to wait out dist.timeout_seconds.
  port_ = free_port();
  auto missing = run_ranks({"train " + cfg + run + at15,
                            "train " + cfg + run + " --resume " + (dir_ / "not-on-this-node").string()});
  for (const RankResult& rank : missing) {
    EXPECT_NE(rank.exit_code, 0) << rank.output;
    // Each rank names rank 1's reason (it published it), not a wait that timed out.
    EXPECT_NE(rank.output.find("none, it stopped: "), std::string::npos) << rank.output;
    EXPECT_EQ(rank.output.find("timed out"), std::string::npos) << rank.output;
    EXPECT_NE(rank.output.find("not-on-this-node"), std::string::npos) << rank.output;
  }
  // A copy of the checkpoint elsewhere (another node's disk) is the same resume point.
  fs::copy(ckpts / "step-00000015", dir_ / "copy", fs::copy_options::recursive);
  port_ = free_port();
  auto same = run_ranks(
      {"train " + cfg + run + at15, "train " + cfg + run + " --resume " + (dir_ / "copy").string()});
  EXPECT_EQ(same[0].exit_code, 0) << same[0].output;
  EXPECT_EQ(same[1].exit_code, 0) << same[1].output;
}

// The seed guides' first pitfall, through `trainer train`: a rank that would run one step more than
// the others in an epoch (test hook: rank 1 claims one more) stops every rank at that epoch's start,
// naming the counts, instead of waiting forever in its extra all-reduce.
TEST_F(DistributedTrain, ARankWithMoreStepsInAnEpochStopsEveryRankBeforeIt) {
  const std::string cfg = write_config(kMlpConfig);
  const std::string args = "train " + cfg + " --set train.run_dir=" + (dir_ / "steps").string();
  const std::string hook = "TRAINER_TEST_EPOCH_STEPS=1:1";
  auto r = run_ranks({args, args}, {hook, hook});
  for (const RankResult& rank : r) {
    EXPECT_NE(rank.exit_code, 0) << rank.output;
    EXPECT_NE(
        rank.output.find("ranks disagree on the number of steps in epoch 1: 2 on rank(s) 0; 3 on rank(s) 1"),
        std::string::npos)
        << rank.output;
  }
}

// Nodes launched with different numbers of processes (LOCAL_WORLD_SIZE) stop at the start, naming it.
TEST_F(DistributedTrain, RanksWithDifferentLocalWorldSizesStopAtStart) {
  const std::string cfg = write_config(kMlpConfig);
  const std::string args = "train " + cfg + " --set train.run_dir=" + (dir_ / "lws").string();
  auto r = run_ranks({args, args}, {"LOCAL_WORLD_SIZE=1", ""});
  for (const RankResult& rank : r) {
    EXPECT_NE(rank.exit_code, 0) << rank.output;
    EXPECT_NE(rank.output.find("local world size: '1' on rank(s) 0; '2' on rank(s) 1"), std::string::npos)
        << rank.output;
  }
}

// A rank that fails while building its experiment (here its dataset directory is missing, the seed
// guides' "nodes with different data" at its plainest) stops the others at once, at the start-up
// check, instead of leaving them to wait out dist.timeout_seconds for a rank that has gone.
TEST_F(DistributedTrain, ARankWhoseDatasetIsMissingStopsTheOthersAtOnce) {
  const std::string cfg = write_config(std::string(kMlpConfig) + "[dist]\ntimeout_seconds = 60\n");
  const std::string run = " --set train.run_dir=" + (dir_ / "m").string();
  auto r = run_ranks({"train " + cfg + run, "train " + cfg + run +
                                                " --set data.dataset=image_folder --set data.root=" +
                                                (dir_ / "not-on-this-node").string()});
  EXPECT_NE(r[1].exit_code, 0) << r[1].output;
  EXPECT_NE(r[1].output.find("not-on-this-node"), std::string::npos) << r[1].output;
  EXPECT_NE(r[0].exit_code, 0) << r[0].output;
  // Rank 0 stops because rank 1 failed (its communicator went away), not because the 60 s timeout ran
  // out waiting for it.
  EXPECT_NE(r[0].output.find("because rank 1 failed"), std::string::npos) << r[0].output;
  EXPECT_EQ(r[0].output.find("timed out"), std::string::npos) << r[0].output;
}

TEST_F(DistributedTrain, ARankThatNeverStartsIsReportedAfterTheTimeout) {
  const std::string cfg = write_config(std::string(kMlpConfig) + "[dist]\ntimeout_seconds = 3\n");
  // Only rank 0 of a world of 2 is started.
  const char* bin_env = std::getenv("TRAINER_BIN");
  const std::string bin = bin_env ? bin_env : TRAINER_BINARY_DIR "/trainer";
  const auto start = std::chrono::steady_clock::now();
  const std::string cmd =
      "RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
      std::to_string(port_) + " " + bin + " train " + cfg + " --set train.run_dir=" + (dir_ / "z").string() +
      " > " + (dir_ / "z.out").string() + " 2>&1";
  const int status = std::system(cmd.c_str());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(status, 0);
  EXPECT_LT(seconds, 3 + 10);
  const std::string out = read_file(dir_ / "z.out");
  EXPECT_NE(out.find("rank"), std::string::npos) << out;
  EXPECT_NE(out.find("HINT"), std::string::npos) << out;
}

// A rank waiting at start-up for a peer that never comes (a node still booting, a wrong WORLD_SIZE)
// stops at once on SIGTERM (a launcher's or scheduler's stop, Ctrl-C alike), exiting with 128 + 15 and
// saying what it waited for, instead of waiting out dist.timeout_seconds (here ten minutes).
TEST_F(DistributedTrain, ARankWaitingForAMissingPeerStopsOnSigterm) {
  const std::string cfg = write_config(std::string(kMlpConfig) + "[dist]\ntimeout_seconds = 600\n");
  const fs::path out = dir_ / "w.out";
  ChildProcess rank0(
      {trainer::testing::trainer_binary(), "train", cfg, "--set", "train.run_dir=" + (dir_ / "w").string()},
      out.string(),
      {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
       "MASTER_PORT=" + std::to_string(port_)});
  // Rank 0 serves the rendezvous store on MASTER_PORT after its stop handlers are in place; then it waits.
  const auto deadline = ChildProcess::Clock::now() + std::chrono::seconds(60);
  while (rank0.running() && !trainer::testing::accepts_connections(port_) &&
         ChildProcess::Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(rank0.running()) << read_file(out);
  rank0.signal(SIGTERM);
  const std::optional<int> code = rank0.wait_until(ChildProcess::Clock::now() + std::chrono::seconds(60));
  ASSERT_TRUE(code.has_value()) << "still waiting a minute after SIGTERM:\n" << read_file(out);
  const std::string text = read_file(out);
  EXPECT_EQ(*code, 128 + SIGTERM) << text;
  EXPECT_NE(text.find("stopped by signal 15"), std::string::npos) << text;
  EXPECT_NE(text.find("while waiting for"), std::string::npos) << text;
}

TEST_F(DistributedTrain, ADeadRankStopsTheOthersWithAMessageInsteadOfAHang) {
  const std::string cfg = write_config(
      "[model]\nname = \"cnn\"\nin_channels = 1\n"
      "[data]\ndataset = \"synthetic\"\nsynthetic_samples = 20000\nsynthetic_image_size = 16\nbatch_size = "
      "16\n"
      "[train]\nepochs = 5\n[dist]\ntimeout_seconds = 5\n[checkpoint]\nevery_epochs = 0\nsave_final = "
      "false\n");
  const auto start = std::chrono::steady_clock::now();
  auto r = run_ranks({"train " + cfg + " --set train.run_dir=" + (dir_ / "d").string(),
                      "train " + cfg + " --set train.run_dir=" + (dir_ / "d").string()},
                     {"", "timeout -s KILL 3"});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r[1].exit_code, 137);  // killed
  EXPECT_NE(r[0].exit_code, 0) << r[0].output;
  EXPECT_NE(r[0].output.find("rank 1"), std::string::npos) << r[0].output;
  EXPECT_LT(seconds, 60.0);
}

}  // namespace
}  // namespace trainer
