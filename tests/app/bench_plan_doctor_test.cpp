// End-to-end tests of `trainer bench`, `trainer plan` and `trainer doctor`: the binary runs as a user
// runs it.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "app/bench_command.h"
#include "app/plan_command.h"
#include "nn/allocator.h"
#include "nn/models/registry.h"
#include "nn/tensor.h"
#include "trainer_process.h"

namespace {

namespace fs = std::filesystem;
using namespace trainer;

using trainer::testing::read_file;
using trainer::testing::run_trainer;
using trainer::testing::RunResult;

class BenchPlanDoctor : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("trainer_bpd_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string tiny_config(const std::string& extra = "") {
    const fs::path path = dir_ / "tiny.toml";
    std::ofstream(path) << "[model]\nname = \"cnn\"\nin_channels = 1\n"
                           "[data]\ndataset = \"synthetic\"\nsynthetic_image_size = 12\nbatch_size = 16\n"
                           "[train]\nepochs = 1\n[optim]\nlr = 0.05\n"
                        << extra;
    return path.string();
  }
  fs::path dir_;
};

using Bench = BenchPlanDoctor;
using Plan = BenchPlanDoctor;
using Doctor = BenchPlanDoctor;

TEST_F(Bench, OneAndTwoProcessesWriteTableCsvJsonAndChart) {
  const fs::path out = dir_ / "bench";
  RunResult r =
      run_trainer("bench " + tiny_config() + " --procs 1,2 --steps 4 --warmup 2 --out " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* col :
       {"procs", "batch/rank", "global", "img/s", "speedup", "efficiency", "allreduce_exposed", "data_wait"})
    EXPECT_NE(r.output.find(col), std::string::npos) << col << "\n" << r.output;

  std::istringstream csv(read_file(out / "bench.csv"));
  std::string header, row1, row2, extra;
  std::getline(csv, header);
  std::getline(csv, row1);
  std::getline(csv, row2);
  EXPECT_FALSE(std::getline(csv, extra) && !extra.empty()) << "more than 2 rows";
  EXPECT_EQ(
      header.rfind("procs,batch_per_rank,global_batch,precision,lr,img_per_s,img_per_s_ci95,speedup,", 0),
      0u);
  // 1 process: 16 images, lr 0.05 * 16 / 128; speedup exactly 1.
  EXPECT_EQ(row1.rfind("1,16,16,fp32,0.00625,", 0), 0u) << row1;
  EXPECT_NE(row1.find(",1.0000,1.0000,"), std::string::npos) << row1;
  EXPECT_EQ(row2.rfind("2,16,32,fp32,0.0125,", 0), 0u) << row2;

  const std::string json = read_file(out / "bench.json");
  for (const char* key : {"\"environment\"", "\"build\": \"trainer ", "\"hostname\"", "\"cpu_cores\"",
                          "\"nccl_env\"", "\"points\"", "\"speedup\": 1.0000", "\"img_per_s_ci95\""})
    EXPECT_NE(json.find(key), std::string::npos) << key << "\n" << json;

  const std::string png = read_file(out / "speedup.png");
  ASSERT_GE(png.size(), 8u);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  // Each run kept its step times: warm-up + steps rows after the header.
  const std::string steps = read_file(out / "p2-b16-fp32-r1" / "step_times.csv");
  EXPECT_EQ(steps.rfind("step,step_seconds,data_wait_seconds,", 0), 0u) << steps;
  EXPECT_EQ(std::count(steps.begin(), steps.end(), '\n'), 7) << steps;
}

TEST_F(Bench, ToAccuracyIsRefusedClearly) {
  RunResult r = run_trainer("bench " + tiny_config() + " --procs 1 --to-accuracy 0.9");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--to-accuracy is not implemented"), std::string::npos) << r.output;
  RunResult h = run_trainer("bench --help");
  EXPECT_EQ(h.exit_code, 0);
  EXPECT_NE(h.output.find("NOT IMPLEMENTED"), std::string::npos) << h.output;
}

TEST(BenchStats, StudentIntervalAndQuantiles) {
  EXPECT_DOUBLE_EQ(student_t975(1), 12.706);
  EXPECT_DOUBLE_EQ(student_t975(100), 1.96);
  const MeanInterval m = mean_interval95({1.0, 2.0, 3.0});
  EXPECT_DOUBLE_EQ(m.mean, 2.0);
  EXPECT_NEAR(m.half_width, 4.303 * 1.0 / std::sqrt(3.0), 1e-12);
  EXPECT_EQ(mean_interval95({5.0}).half_width, 0.0);
}

TEST(PlanMath, BytesPerParameterAndZeroSharding) {
  const BytesPerParam fp32 = bytes_per_param("fp32", "sgd", 0.9);
  EXPECT_EQ(fp32.weights + fp32.gradients + fp32.master + fp32.optimizer, 12);
  const BytesPerParam bf16 = bytes_per_param("bf16", "adamw", 0.9);
  EXPECT_EQ(bf16.weights, 4);  // autocast: fp32 weights are the master copy
  EXPECT_EQ(bf16.master, 0);
  EXPECT_EQ(bf16.optimizer, 8);
  EXPECT_EQ(bytes_per_param("fp32", "sgd", 0.0).optimizer, 0);
  const auto rows = strategy_memory(1000, bf16, 500, 4);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_DOUBLE_EQ(rows[0].total(), 1000.0 * 16 + 500);
  EXPECT_DOUBLE_EQ(rows[1].optimizer, rows[0].optimizer / 4);
  EXPECT_DOUBLE_EQ(rows[1].master, rows[0].master / 4);
  EXPECT_DOUBLE_EQ(rows[1].gradients, rows[0].gradients);
  EXPECT_DOUBLE_EQ(rows[2].gradients, rows[0].gradients / 4);
  EXPECT_DOUBLE_EQ(rows[2].weights, rows[0].weights);
  EXPECT_DOUBLE_EQ(rows[3].weights, rows[0].weights / 4);
  EXPECT_DOUBLE_EQ(rows[3].activations, 500);
  // Buckets of 10 and 990 elements at 4 ranks: the ZeRO-2 shard is ceil(10/4) + ceil(990/4) = 251
  // elements; gradients add the reduction buffer (992, the larger bucket padded) and the bucket being
  // filled (990).
  const auto bucketed = strategy_memory(1000, bf16, 500, 4, {10, 990});
  EXPECT_DOUBLE_EQ(bucketed[2].optimizer, 251.0 * 8);
  EXPECT_DOUBLE_EQ(bucketed[2].gradients, (251.0 + 992 + 990) * 4);
  EXPECT_DOUBLE_EQ(bucketed[1].optimizer, rows[1].optimizer);
}

TEST(PlanMemoryStats, CpuAllocatorCountsAllocatedAndPeakBytes) {
  const int64_t before = cpu_memory_stats().allocated_bytes;
  cpu_reset_peak_memory_stats();
  {
    Tensor t = Tensor::zeros({1000});  // 4000 bytes, rounded to 4032
    EXPECT_EQ(cpu_memory_stats().allocated_bytes, before + 4032);
  }
  EXPECT_EQ(cpu_memory_stats().allocated_bytes, before);
  EXPECT_GE(cpu_memory_stats().peak_allocated_bytes, before + 4032);
  cpu_reset_peak_memory_stats();
  EXPECT_EQ(cpu_memory_stats().peak_allocated_bytes, before);
}

// Parses "NAME  a MiB  b MiB ..." rows of the plan table.
std::vector<double> table_row(const std::string& out, const std::string& name) {
  std::vector<double> v;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name + " ", 0) != 0) continue;
    std::istringstream cells(line.substr(name.size()));
    std::string unit;
    for (double x; cells >> x >> unit;) v.push_back(x);
  }
  return v;
}

TEST_F(Plan, Resnet18ParameterCountAndShardedOptimizerState) {
  // The CIFAR config's dataset is not here: plan needs only its shape.
  RunResult r = run_trainer("plan " TRAINER_SOURCE_DIR
                            "/configs/cifar10_resnet18.toml --procs 4 --set data.batch_size=4 "
                            "--device-memory 16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ModelOptions m;
  m.name = "resnet18";
  m.stem = "cifar";
  m.num_classes = 10;
  const int64_t params = create_model(m)->parameter_count();
  EXPECT_EQ(params, 11173962);
  EXPECT_NE(r.output.find("parameters: 11,173,962"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("weights 4, gradients 4, fp32 master 0, optimizer state 4"), std::string::npos)
      << r.output;
  const std::vector<double> dp = table_row(r.output, "DP"), z1 = table_row(r.output, "ZeRO-1");
  ASSERT_EQ(dp.size(), 6u) << r.output;
  ASSERT_EQ(z1.size(), 6u) << r.output;
  EXPECT_NEAR(dp[3], params * 4 / 1048576.0, 0.06);  // optimizer state, MiB
  EXPECT_NEAR(z1[3], dp[3] / 4, 0.06);
  EXPECT_EQ(z1[0], dp[0]);
  EXPECT_GT(dp[4], 0.0) << "activations measured";
  EXPECT_NE(r.output.find("recommendation: DP"), std::string::npos) << r.output;

  RunResult tight = run_trainer("plan " + tiny_config() + " --procs 2 --device-memory 0.0001");
  ASSERT_EQ(tight.exit_code, 0) << tight.output;
  EXPECT_NE(tight.output.find("recommendation: none fits"), std::string::npos) << tight.output;
}

TEST_F(Doctor, PassesWithValidConfigAndFailsWithMissingDataRoot) {
  RunResult ok = run_trainer("doctor " + tiny_config() + " --set train.run_dir=" + (dir_ / "run").string());
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  for (const char* line : {"PASS  build", "PASS  cpu", "PASS  openblas", "PASS  launcher", "PASS  config",
                           "PASS  dataset", "PASS  run dir", "all checks passed"})
    EXPECT_NE(ok.output.find(line), std::string::npos) << line << "\n" << ok.output;
  EXPECT_EQ(ok.output.find("FAIL"), std::string::npos) << ok.output;

  const fs::path bad = dir_ / "bad.toml";
  std::ofstream(bad) << "[data]\ndataset = \"cifar10\"\nroot = \"" << (dir_ / "no-such-dir").string()
                     << "\"\n";
  RunResult fail = run_trainer("doctor " + bad.string());
  EXPECT_EQ(fail.exit_code, 1) << fail.output;
  EXPECT_NE(fail.output.find("FAIL  dataset"), std::string::npos) << fail.output;
  EXPECT_NE(fail.output.find("no-such-dir"), std::string::npos) << fail.output;
}

TEST_F(Doctor, BadLauncherVariablesFail) {
  RunResult r = run_trainer("doctor");  // no config: machine checks only
  EXPECT_EQ(r.exit_code, 0) << r.output;
  RunResult bad = run_trainer("doctor", "RANK=3 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1");
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_NE(bad.output.find("FAIL  launcher"), std::string::npos) << bad.output;
}

}  // namespace
