// End-to-end tests of `trainer bench`, `trainer plan` and `trainer doctor`: the binary runs as a user
// runs it.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>

#include "app/commands/bench/bench_command.h"
#include "app/commands/plan/plan_command.h"
#include "nn/allocator.h"
#include "nn/models/registry.h"
#include "nn/tensor.h"
#include "run_outputs.h"
#include "trainer_process.h"

namespace {

namespace fs = std::filesystem;
using namespace trainer;

using trainer::testing::number_after;
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

  const nlohmann::json json = nlohmann::json::parse(read_file(out / "bench.json"));
  const nlohmann::json& env = json.at("environment");
  EXPECT_EQ(env.at("build").get<std::string>().rfind("trainer ", 0), 0u) << env;
  for (const char* key : {"hostname", "cpu_cores", "nccl_env"}) EXPECT_TRUE(env.contains(key)) << key;
  ASSERT_EQ(json.at("points").size(), 2u) << json;
  const nlohmann::json& one = json.at("points")[0];
  EXPECT_EQ(one.at("procs"), 1);
  EXPECT_EQ(one.at("lr"), 0.00625);
  EXPECT_EQ(one.at("speedup"), 1.0);
  EXPECT_GT(one.at("img_per_s_ci95").get<double>(), 0.0) << one;
  EXPECT_EQ(json.at("points")[1].at("global_batch"), 32);

  const std::string png = read_file(out / "speedup.png");
  ASSERT_GE(png.size(), 8u);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  // Each run kept its step times: warm-up + steps rows after the header.
  const std::string steps = read_file(out / "p2-b16-fp32-r1" / "step_times.csv");
  EXPECT_EQ(steps.rfind("step,step_seconds,data_wait_seconds,", 0), 0u) << steps;
  EXPECT_EQ(std::count(steps.begin(), steps.end(), '\n'), 7) << steps;
}

// Splits a CSV row into its cells (empty cells kept).
std::vector<std::string> cells(const std::string& row) {
  std::vector<std::string> out;
  std::stringstream in(row);
  for (std::string c; std::getline(in, c, ',');) out.push_back(c);
  if (!row.empty() && row.back() == ',') out.push_back("");
  return out;
}

// bench.csv as header -> cell per row.
std::vector<std::map<std::string, std::string>> csv_rows(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);
  const std::vector<std::string> header = cells(line);
  std::vector<std::map<std::string, std::string>> rows;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const std::vector<std::string> c = cells(line);
    EXPECT_EQ(c.size(), header.size()) << line;
    std::map<std::string, std::string> row;
    for (size_t i = 0; i < header.size() && i < c.size(); ++i) row[header[i]] = c[i];
    rows.push_back(row);
  }
  return rows;
}

TEST_F(Bench, ToAccuracyReportsEpochsAndTimeToTheTarget) {
  // 5% test top-1 on 10 classes: reached after the first epoch by any model.
  const fs::path out = dir_ / "tta";
  RunResult r = run_trainer("bench " + tiny_config() +
                            " --procs 1,2 --to-accuracy 0.05 --set data.synthetic_samples=320 "
                            "--set train.epochs=3 --out " +
                            out.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* col : {"procs", "target", "epochs", "time to accuracy", "wall s", "best top1", "speedup",
                          "efficiency", "allreduce_exposed", "data_wait"})
    EXPECT_NE(r.output.find(col), std::string::npos) << col << "\n" << r.output;
  const std::string csv = read_file(out / "bench.csv");
  EXPECT_EQ(
      csv.rfind("procs,batch_per_rank,global_batch,precision,lr,target_accuracy,reached,epochs,"
                "time_to_accuracy_seconds,time_to_accuracy_ci95,wall_seconds,best_test_accuracy,speedup,"
                "efficiency,allreduce_exposed_pct,data_wait_pct,repeats,diverged\n",
                0),
      0u)
      << csv;
  const auto rows = csv_rows(csv);
  ASSERT_EQ(rows.size(), 2u) << csv;
  EXPECT_EQ(rows[0].at("procs"), "1");
  EXPECT_EQ(rows[1].at("procs"), "2");
  EXPECT_EQ(rows[1].at("global_batch"), "32");
  for (const auto& row : rows) {
    EXPECT_EQ(row.at("target_accuracy"), "0.05");
    EXPECT_EQ(row.at("reached"), "true") << csv;
    const int epochs = std::stoi(row.at("epochs"));
    EXPECT_GE(epochs, 1);
    EXPECT_LE(epochs, 3);
    EXPECT_GE(std::stod(row.at("best_test_accuracy")), 0.05);
    EXPECT_GT(std::stod(row.at("time_to_accuracy_seconds")), 0.0);
    // The run's wall clock holds its training seconds plus start-up and evaluation.
    EXPECT_GT(std::stod(row.at("wall_seconds")), std::stod(row.at("time_to_accuracy_seconds")));
  }
  // Speedup comes from the times to accuracy.
  EXPECT_EQ(rows[0].at("speedup"), "1.0000");
  const double t1 = std::stod(rows[0].at("time_to_accuracy_seconds"));
  const double t2 = std::stod(rows[1].at("time_to_accuracy_seconds"));
  EXPECT_NEAR(std::stod(rows[1].at("speedup")), t1 / t2, 1e-3 * t1 / t2 + 1e-3);
  EXPECT_NEAR(std::stod(rows[1].at("efficiency")), t1 / t2 / 2, 1e-3 * t1 / t2 + 1e-3);
  // Each run stopped at the epoch that reached the target.
  const std::string log = read_file(out / "p1-b16-fp32-r1" / "output.log");
  EXPECT_NE(log.find("target 5.00% reached"), std::string::npos) << log;

  const nlohmann::json json = nlohmann::json::parse(read_file(out / "bench.json"));
  EXPECT_EQ(json.at("mode"), "time_to_accuracy");
  EXPECT_EQ(json.at("target_accuracy"), 0.05);
  EXPECT_TRUE(json.at("environment").is_object());
  ASSERT_EQ(json.at("points").size(), 2u) << json;
  for (const nlohmann::json& p : json.at("points")) {
    EXPECT_EQ(p.at("reached"), true) << p;
    EXPECT_GT(p.at("time_to_accuracy_seconds").get<double>(), 0.0) << p;
  }
  EXPECT_EQ(json.at("points")[0].at("speedup"), 1.0);
  const std::string png = read_file(out / "speedup.png");
  ASSERT_GE(png.size(), 8u);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
}

TEST_F(Bench, ToAccuracyNotReachedHasNoTimeAndNoSpeedup) {
  // A learning rate too small to learn anything, and a target no untrained model reaches.
  const fs::path out = dir_ / "tta";
  RunResult r =
      run_trainer("bench " + tiny_config() +
                  " --procs 1,2 --to-accuracy 1 --set data.synthetic_samples=160 --set train.epochs=2 "
                  "--set optim.lr=0.000000001 --out " +
                  out.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("not reached"), std::string::npos) << r.output;
  const auto rows = csv_rows(read_file(out / "bench.csv"));
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& row : rows) {
    EXPECT_EQ(row.at("reached"), "false");
    EXPECT_EQ(row.at("epochs"), "2");  // every epoch of train.epochs ran
    EXPECT_EQ(row.at("time_to_accuracy_seconds"), "");
    EXPECT_EQ(row.at("speedup"), "");
    EXPECT_LT(std::stod(row.at("best_test_accuracy")), 1.0);
  }
  const nlohmann::json json = nlohmann::json::parse(read_file(out / "bench.json"));
  for (const nlohmann::json& p : json.at("points")) {
    EXPECT_EQ(p.at("reached"), false) << p;
    EXPECT_TRUE(p.at("time_to_accuracy_seconds").is_null()) << p;
    EXPECT_TRUE(p.at("speedup").is_null()) << p;
  }
}

TEST_F(Bench, ToAccuracyOutsideZeroToOneIsAUsageError) {
  RunResult r = run_trainer("bench " + tiny_config() + " --procs 1 --to-accuracy 90");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--to-accuracy expects a test top-1 fraction in (0, 1]"), std::string::npos)
      << r.output;
  RunResult h = run_trainer("bench --help");
  EXPECT_EQ(h.exit_code, 0);
  EXPECT_NE(h.output.find("--to-accuracy X"), std::string::npos) << h.output;
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
  const BytesPerParam fp32 = bytes_per_param(OptimizerKind::sgd, 0.9);
  EXPECT_EQ(fp32.weights + fp32.gradients + fp32.master + fp32.optimizer, 12);
  const BytesPerParam bf16 = bytes_per_param(OptimizerKind::adamw, 0.9);
  EXPECT_EQ(bf16.weights, 4);  // autocast: fp32 weights are the master copy
  EXPECT_EQ(bf16.master, 0);
  EXPECT_EQ(bf16.optimizer, 8);
  EXPECT_EQ(bytes_per_param(OptimizerKind::sgd, 0.0).optimizer, 0);
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

// ema.enabled: the weight average's copy is added whole to every strategy, never sharded.
TEST(PlanMath, TheEmaCopyIsAddedUnshardedToEveryStrategy) {
  const BytesPerParam adamw = bytes_per_param(OptimizerKind::adamw, 0.9);
  const auto without = strategy_memory(1000, adamw, 500, 4, {10, 990});
  const auto with = strategy_memory(1000, adamw, 500, 4, {10, 990}, 4321);
  ASSERT_EQ(with.size(), without.size());
  for (size_t s = 0; s < with.size(); ++s) {
    EXPECT_DOUBLE_EQ(with[s].ema, 4321) << with[s].name;
    EXPECT_DOUBLE_EQ(with[s].total() - without[s].total(), 4321) << with[s].name;
  }
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

// ema.enabled keeps a second copy of the weights and buffers on every rank: plan reports it as its own
// line and column, and its total per rank grows by exactly that many bytes.
TEST_F(Plan, TheEmaCopyIsCountedAsItsOwnLine) {
  const std::string cfg = tiny_config();
  RunResult plain = run_trainer("plan " + cfg + " --procs 2");
  RunResult ema = run_trainer("plan " + cfg + " --procs 2 --set ema.enabled=true");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  ASSERT_EQ(ema.exit_code, 0) << ema.output;
  EXPECT_EQ(plain.output.find("ema copy"), std::string::npos) << plain.output;
  // The tiny config's model: the cnn on 1x12x12 images, 10 classes; the average copies its state dict.
  ModelOptions m;
  m.name = "cnn";
  m.in_channels = 1;
  m.image_size = 12;
  m.num_classes = 10;
  long long state_bytes = 0;
  for (const NamedTensor& entry : create_model(m)->state_dict())
    state_bytes += static_cast<long long>(entry.tensor->nbytes());
  EXPECT_EQ(number_after(ema.output, "ema copy: "), state_bytes) << ema.output;
  const long long total_plain = number_after(plain.output, "; total ");
  const long long total_ema = number_after(ema.output, "; total ");
  ASSERT_GT(total_plain, 0) << plain.output;
  EXPECT_EQ(total_ema - total_plain, state_bytes) << plain.output << ema.output;
  const std::vector<double> dp = table_row(ema.output, "DP");
  ASSERT_EQ(dp.size(), 7u) << ema.output;  // weights ... activations, the ema copy, the total
  EXPECT_NEAR(dp[5], state_bytes / 1048576.0, 0.06);
}

TEST_F(Plan, AllReduceTimeFromGivenOrMeasuredBusBandwidth) {
  RunResult given = run_trainer("plan " + tiny_config() + " --procs 4 --bus-bandwidth 100");
  ASSERT_EQ(given.exit_code, 0) << given.output;
  EXPECT_TRUE(std::regex_search(
      given.output, std::regex(R"(gradients per step at 100 GB/s bus bandwidth \(given; .*: [0-9.]+ ms)")))
      << given.output;
  // No GPU here: measured by the CPU communicator between 2 local ranks, as `trainer doctor` does.
  RunResult measured = run_trainer("plan " + tiny_config() + " --procs 4 --bus-bandwidth measure");
  ASSERT_EQ(measured.exit_code, 0) << measured.output;
  EXPECT_TRUE(std::regex_search(
      measured.output,
      std::regex(
          R"(at [0-9.e+-]+ GB/s bus bandwidth \(measured: tcp all-reduce of 16 MiB across 2 local ranks; .*: [0-9.]+ ms)")))
      << measured.output;
}

TEST_F(Doctor, PassesWithValidConfigAndFailsWithMissingDataRoot) {
  RunResult ok = run_trainer("doctor " + tiny_config() + " --set train.run_dir=" + (dir_ / "run").string());
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  for (const char* line : {"PASS  build", "PASS  cpu", "PASS  openblas", "PASS  launcher", "PASS  config",
                           "PASS  dataset", "PASS  run dir", "all checks passed"})
    EXPECT_NE(ok.output.find(line), std::string::npos) << line << "\n" << ok.output;
  EXPECT_EQ(ok.output.find("FAIL"), std::string::npos) << ok.output;
  // Fewer than 2 GPUs here (a CPU-only build, or CUDA compiled in and no GPU): the topology and NCCL
  // checks say why they are skipped, and the CPU communicator's all-reduce is checked between 2 local
  // ranks, with a bus bandwidth row per size.
  for (const char* check : {"peer-to-peer  ", "nccl allreduce"})
    EXPECT_TRUE(std::regex_search(
        ok.output, std::regex(std::string("SKIP  ") + check + R"( (CPU-only build|[01] GPU\(s\) visible))")))
        << check << "\n"
        << ok.output;
  for (const char* line : {"PASS  allreduce      tcp communicator, 2 ranks",
                           "sum and average correct on every rank", "size        time/op     bus bandwidth"})
    EXPECT_NE(ok.output.find(line), std::string::npos) << line << "\n" << ok.output;
  for (const char* size : {"64 KiB", "1 MiB", "16 MiB"})
    EXPECT_TRUE(
        std::regex_search(ok.output, std::regex(std::string(" ") + size + R"( +[0-9.]+ ms +[0-9.]+ GB/s)")))
        << size << "\n"
        << ok.output;

  const fs::path bad = dir_ / "bad.toml";
  std::ofstream(bad) << "[data]\ndataset = \"cifar10\"\nroot = \"" << (dir_ / "no-such-dir").string()
                     << "\"\n";
  RunResult fail = run_trainer("doctor " + bad.string());
  EXPECT_EQ(fail.exit_code, 1) << fail.output;
  EXPECT_NE(fail.output.find("FAIL  dataset"), std::string::npos) << fail.output;
  EXPECT_NE(fail.output.find("no-such-dir"), std::string::npos) << fail.output;
}

// Rank 0's master port taken by another job, and a run directory that cannot be written (its parent is
// a file: a check that holds for root too), each FAIL with the thing named and what to do.
TEST_F(Doctor, ATakenMasterPortAndAnUnwritableRunDirFail) {
  trainer::testing::TakenPort taken;
  ASSERT_NE(taken.port(), 0);
  const std::string port = std::to_string(taken.port());
  std::ofstream(dir_ / "a-file") << "x";
  RunResult r = run_trainer(
      "doctor " + tiny_config() + " --set train.run_dir=" + (dir_ / "a-file/run").string(),
      "RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port);
  taken.release();
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("FAIL  master port +" + port + " ")) &&
              r.output.find("choose another MASTER_PORT") != std::string::npos)
      << r.output;
  EXPECT_TRUE(
      std::regex_search(r.output, std::regex("FAIL  run dir +.*a-file/run: cannot write in .*a-file")) &&
      r.output.find("choose a writable directory") != std::string::npos)
      << r.output;
}

TEST_F(Doctor, BadLauncherVariablesFail) {
  RunResult r = run_trainer("doctor");  // no config: machine checks only
  EXPECT_EQ(r.exit_code, 0) << r.output;
  RunResult bad = run_trainer("doctor", "RANK=3 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1");
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_NE(bad.output.find("FAIL  launcher"), std::string::npos) << bad.output;
}

}  // namespace
