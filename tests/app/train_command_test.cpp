// End-to-end tests of `trainer train` / `eval` / `config`: the binary is run as a user would run it.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "metrics/run_csv_util.h"
#include "nn/safetensors.h"
#include "run_outputs.h"
#include "trainer_process.h"

namespace {

namespace fs = std::filesystem;

using trainer::testing::read_file;
using trainer::testing::run_trainer;
using trainer::testing::RunResult;

class TrainCommand : public trainer::testing::TrainerRunTest {
 protected:
  TrainCommand() : TrainerRunTest("trainer_e2e_") {}

  // A small synthetic run that takes a second or two.
  std::string write_config(const std::string& extra = "") {
    return write_small_config("[train]\nepochs = 2\nlog_every_steps = 4\n[optim]\nlr = 0.05\n" + extra);
  }
};

// A diverging run (an absurd learning rate) stops at the first non-finite loss with the step and a
// hint, and writes no final checkpoint of NaN weights.
TEST_F(TrainCommand, ANanLossStopsTheRunWithTheStepAndAHint) {
  const RunResult r =
      run_trainer("train " + write_config() + " --set optim.lr=1e12 --set train.run_dir=" + run_dir("nan"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(r.output.find("loss is NaN at step") != std::string::npos ||
              r.output.find("loss is infinite at step") != std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("training diverged. HINT: lower optim.lr"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir_ / "nan" / "checkpoints" / "final.safetensors"));
}

TEST_F(TrainCommand, TrainsAndWritesRunDirectoryAndSummary) {
  const std::string summary = (dir_ / "summary.json").string();
  RunResult r = run_trainer("train " + write_config() + " --set train.run_dir=" + run_dir("a") +
                            " --summary " + summary);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* f : {"config.toml", "train.log", "train_steps.csv", "metrics.csv", "summary.json",
                        "checkpoints/final.safetensors"})
    EXPECT_TRUE(fs::exists(dir_ / "a" / f)) << f;
  // metrics.csv: the header and one row per epoch, the last one evaluated.
  const std::string epochs = read_file(dir_ / "a/metrics.csv");
  EXPECT_EQ(std::count(epochs.begin(), epochs.end(), '\n'), 3) << epochs;
  EXPECT_EQ(epochs.rfind("wall_time,epoch,step,train_loss,eval_loss,eval_top1,", 0), 0u) << epochs;
  EXPECT_NE(epochs.find(",2,16,"), std::string::npos) << epochs;
  // train.log: every line starts with its UTC time, "2026-12-03T15:04:05.123Z ".
  const std::string log = read_file(dir_ / "a/train.log");
  ASSERT_GT(log.size(), 25u);
  EXPECT_EQ(log.substr(10, 1) + log.substr(23, 2), "TZ ") << log.substr(0, 80);
  const std::string json = read_file(summary);
  for (const char* key :
       {"\"epochs\": 2", "\"steps\": 16", "\"world_size\": 1", "\"train_seconds\"", "\"samples_per_second\"",
        "\"final_test_accuracy\"", "\"best_test_accuracy\"", "\"final_train_loss\""})
    EXPECT_NE(json.find(key), std::string::npos) << key << " in " << json;
  // The weights load back for evaluation.
  RunResult e =
      run_trainer("eval " + write_config() + " --weights " + run_dir("a") + "/checkpoints/final.safetensors");
  EXPECT_EQ(e.exit_code, 0) << e.output;
  EXPECT_NE(e.output.find("top1"), std::string::npos);
}

// --dump-logits: what scripts/torchvision_logits_check.py compares with PyTorch.
TEST_F(TrainCommand, EvalDumpsImagesLabelsAndLogits) {
  const std::string cfg = write_config();
  ASSERT_EQ(run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("a") + " --set train.max_steps=2")
                .exit_code,
            0);
  const std::string dump = (dir_ / "dump.safetensors").string();
  RunResult e = run_trainer("eval " + cfg + " --weights " + run_dir("a") +
                            "/checkpoints/final.safetensors --dump-logits " + dump);
  ASSERT_EQ(e.exit_code, 0) << e.output;
  auto t = trainer::load_safetensors(dump);
  ASSERT_EQ(t.size(), 3u);
  const int64_t n = t.at("labels").shape()[0];
  EXPECT_GT(n, 0);
  EXPECT_EQ(t.at("images").shape(), (std::vector<int64_t>{n, 1, 12, 12}));
  EXPECT_EQ(t.at("logits").shape(), (std::vector<int64_t>{n, 10}));
}

TEST_F(TrainCommand, SameSeedGivesBitIdenticalLossesWhateverTheWorkerCount) {
  ASSERT_EQ(run_trainer("train " + write_config() + " --set train.run_dir=" + run_dir("w0") +
                        " --set data.workers=0")
                .exit_code,
            0);
  ASSERT_EQ(run_trainer("train " + write_config() + " --set train.run_dir=" + run_dir("w0b") +
                        " --set data.workers=0")
                .exit_code,
            0);
  ASSERT_EQ(run_trainer("train " + write_config() + " --set train.run_dir=" + run_dir("w3") +
                        " --set data.workers=3")
                .exit_code,
            0);
  const std::string a = trainer::testing::without_wall_time(read_file(dir_ / "w0/train_steps.csv"));
  EXPECT_GT(std::count(a.begin(), a.end(), '\n'), 16);
  EXPECT_EQ(a, trainer::testing::without_wall_time(read_file(dir_ / "w0b/train_steps.csv")));
  EXPECT_EQ(a, trainer::testing::without_wall_time(read_file(dir_ / "w3/train_steps.csv")));
  ASSERT_EQ(
      run_trainer("train " + write_config() + " --set train.run_dir=" + run_dir("s1") + " --set train.seed=1")
          .exit_code,
      0);
  EXPECT_NE(a, trainer::testing::without_wall_time(read_file(dir_ / "s1/train_steps.csv")));
}

TEST_F(TrainCommand, MaxStepsBoundsTheRun) {
  RunResult r = run_trainer("train " + write_config() + " --set train.run_dir=" + run_dir("m") +
                            " --set train.max_steps=3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string csv = trainer::testing::without_wall_time(read_file(dir_ / "m/train_steps.csv"));
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 4);  // header + 3 steps
}

TEST_F(TrainCommand, MissingDatasetDirectoryNamesTheKeyAndWhereItWasSet) {
  const fs::path cfg = dir_ / "fm.toml";
  std::ofstream(cfg) << "[data]\ndataset = \"fashion_mnist\"\nroot = \"/nonexistent/fmnist\"\n";
  RunResult r = run_trainer("train " + cfg.string() + " --set train.run_dir=" + run_dir("x"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find(cfg.string() + ":3:8: data.root"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/fmnist"), std::string::npos) << r.output;
  RunResult s = run_trainer("train " + cfg.string() + " --set data.root=/also/missing");
  EXPECT_EQ(s.exit_code, 1);
  EXPECT_NE(s.output.find("--set data.root=/also/missing"), std::string::npos) << s.output;
}

TEST_F(TrainCommand, TruncatedIdxFileStopsWithFileAndProblem) {
  const fs::path root = dir_ / "fmnist";
  fs::create_directories(root);
  // Valid headers, but the image payload is cut short.
  auto write_be32 = [](std::ofstream& o, uint32_t v) {
    const unsigned char b[4] = {static_cast<unsigned char>(v >> 24), static_cast<unsigned char>(v >> 16),
                                static_cast<unsigned char>(v >> 8), static_cast<unsigned char>(v)};
    o.write(reinterpret_cast<const char*>(b), 4);
  };
  for (const std::string split : {"train", "t10k"}) {
    std::ofstream img(root / (split + "-images-idx3-ubyte"), std::ios::binary);
    write_be32(img, 0x803);
    write_be32(img, 100);
    write_be32(img, 28);
    write_be32(img, 28);
    img << std::string(500, '\0');
    std::ofstream lab(root / (split + "-labels-idx1-ubyte"), std::ios::binary);
    write_be32(lab, 0x801);
    write_be32(lab, 100);
    lab << std::string(100, '\1');
  }
  RunResult r = run_trainer("train " + write_config() +
                            " --set data.dataset=fashion_mnist --set data.root=" + root.string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("train-images-idx3-ubyte"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("truncated"), std::string::npos) << r.output;
}

TEST_F(TrainCommand, UsageAndConfigErrorsExitNonZeroWithAMessage) {
  RunResult bad_set = run_trainer("train " + write_config() + " --set train.epochs=many");
  EXPECT_EQ(bad_set.exit_code, 1);
  EXPECT_NE(bad_set.output.find("--set train.epochs=many: train.epochs"), std::string::npos)
      << bad_set.output;
  RunResult no_config = run_trainer("train");
  EXPECT_EQ(no_config.exit_code, 2);
  EXPECT_NE(no_config.output.find("missing CONFIG"), std::string::npos);
  RunResult cpu_bf16 = run_trainer("train " + write_config() + " --set train.precision=bf16");
  EXPECT_EQ(cpu_bf16.exit_code, 1);
  EXPECT_NE(cpu_bf16.output.find("train.precision"), std::string::npos) << cpu_bf16.output;
  // No GPU in this environment (or no CUDA backend in this build): an error, never a silent CPU run.
  RunResult cuda = run_trainer("train " + write_config() + " --set train.device=cuda");
  EXPECT_EQ(cuda.exit_code, 1);
  EXPECT_NE(cuda.output.find("train.device"), std::string::npos) << cuda.output;
  EXPECT_NE(cuda.output.find("HINT"), std::string::npos) << cuda.output;
  RunResult help = run_trainer("train --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.output.find("usage: trainer train"), std::string::npos);
}

// Snapshot + restore equals an uninterrupted run: SIGTERM mid-epoch writes a checkpoint, --resume auto
// continues with exactly the remaining samples, and losses and final weights are bit-identical.
TEST_F(TrainCommand, ResumeAfterSigtermIsBitExact) {
  const std::string cfg = write_config("[checkpoint]\nevery_steps = 5\n");
  ASSERT_EQ(run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("full")).exit_code, 0);
  RunResult killed = run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("cut"),
                                 "TRAINER_TEST_SIGTERM_AT_STEP=11");
  EXPECT_EQ(killed.exit_code, 128 + 15) << killed.output;
  EXPECT_NE(killed.output.find("step-00000011"), std::string::npos) << killed.output;
  RunResult resumed =
      run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("cut") + " --resume auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from"), std::string::npos) << resumed.output;
  // metrics.csv is resumed like train_steps.csv: the epoch rows up to the checkpoint, then the rest.
  trainer::testing::expect_same_run(dir_ / "full", dir_ / "cut");
}

// A closed terminal's SIGHUP stops the run like SIGTERM (a checkpoint at the step, exit 128 + 1)
// instead of killing it without one; under nohup (SIGHUP ignored when the trainer starts) it stays
// ignored and the run goes on to its end.
TEST_F(TrainCommand, SighupCheckpointsAndStopsUnlessIgnoredAtStart) {
  // The trainer inherits SIGHUP's disposition from this process: a test runner that ignores it (one
  // started under nohup) would otherwise decide the first case.
  struct sigaction dfl {
  }, old{};
  dfl.sa_handler = SIG_DFL;
  ::sigaction(SIGHUP, &dfl, &old);
  struct Restore {
    struct sigaction& old;
    ~Restore() { ::sigaction(SIGHUP, &old, nullptr); }
  } restore{old};
  const std::string cfg = write_config("[checkpoint]\nevery_steps = 0\n");
  const std::string hook = "TRAINER_TEST_SIGTERM_AT_STEP=7 TRAINER_TEST_SIGNAL=1";
  RunResult hup = run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("hup"), hook);
  EXPECT_EQ(hup.exit_code, 128 + 1) << hup.output;
  EXPECT_NE(hup.output.find("received signal 1 at step 7"), std::string::npos) << hup.output;
  EXPECT_TRUE(fs::exists(dir_ / "hup/checkpoints/step-00000007")) << hup.output;
  RunResult nohup =
      run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("nohup"), hook, "trap \"\" HUP;");
  EXPECT_EQ(nohup.exit_code, 0) << nohup.output;
  EXPECT_NE(nohup.output.find("done:"), std::string::npos) << nohup.output;
}

// The same stop delivered twice within milliseconds (a hang-up or `scancel` reaches the launcher and
// its ranks, and the launcher forwards it too) is one request: the run still checkpoints and exits
// with 128 + 15, instead of the second signal killing it first.
TEST_F(TrainCommand, ASignalRepeatedAtOnceIsOneStopWithACheckpoint) {
  const std::string cfg = write_config("[checkpoint]\nevery_steps = 0\n");
  // The hook raises SIGTERM at step 7 and again right after the first was handled.
  RunResult r = run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("twice"),
                            "TRAINER_TEST_SIGTERM_AT_STEP=7 TRAINER_TEST_SIGNAL_TWICE=1");
  EXPECT_EQ(r.exit_code, 128 + 15) << r.output;
  EXPECT_NE(r.output.find("received signal 15 at step 7"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(dir_ / "twice/checkpoints/step-00000007")) << r.output;
}

// A run started by a trainer with other step phases (here: the file's header lacks a column) and
// resumed by this one starts step_times.csv again, instead of appending rows wider than the header.
TEST_F(TrainCommand, ResumeWithOtherPhaseColumnsStartsStepTimesAgain) {
  const std::string cfg = write_config("[checkpoint]\nevery_steps = 5\n");
  RunResult killed =
      run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("r"), "TRAINER_TEST_SIGTERM_AT_STEP=7");
  ASSERT_EQ(killed.exit_code, 128 + 15) << killed.output;
  const fs::path csv = dir_ / "r/step_times.csv";
  std::string text = read_file(csv);
  const std::string column = ",graph_seconds";
  ASSERT_NE(text.find(column), std::string::npos) << text;
  text.erase(text.find(column), column.size());  // the header of an older trainer
  std::ofstream(csv, std::ios::trunc) << text;
  RunResult resumed = run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("r") + " --resume auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("step_times.csv: its columns differ"), std::string::npos) << resumed.output;
  std::stringstream lines(read_file(csv));
  std::string header, row;
  std::getline(lines, header);
  EXPECT_NE(header.find(column), std::string::npos) << header;
  int rows = 0;
  while (std::getline(lines, row)) {
    EXPECT_EQ(std::count(row.begin(), row.end(), ','), std::count(header.begin(), header.end(), ',')) << row;
    ++rows;
  }
  EXPECT_GT(rows, 0);
}

TEST_F(TrainCommand, ResumeAutoSkipsACorruptCheckpoint) {
  const std::string cfg = write_config("[checkpoint]\nevery_steps = 4\nkeep_last = 5\n");
  RunResult first =
      run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("c"), "TRAINER_TEST_SIGTERM_AT_STEP=9");
  ASSERT_EQ(first.exit_code, 143) << first.output;
  {  // corrupt the newest checkpoint's weights
    std::fstream f(dir_ / "c/checkpoints/step-00000009/model.safetensors",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-2, std::ios::end);
    f.put('\x55');
  }
  RunResult resumed = run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("c") + " --resume auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("skipping broken checkpoint"), std::string::npos) << resumed.output;
  EXPECT_NE(resumed.output.find("step-00000008"), std::string::npos) << resumed.output;
}

// A full disk (here: a file-size limit) while writing a periodic checkpoint keeps the run going and
// leaves no partial checkpoint; failing to write the final one is an error.
TEST_F(TrainCommand, FullDiskDuringCheckpointIsReportedAndLosesNothing) {
  const std::string cfg = write_config("[checkpoint]\nevery_steps = 4\n");
  RunResult r = run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("f"), "", "ulimit -f 64;");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("earlier checkpoints are intact, training continues"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("not written"), std::string::npos) << r.output;
  for (const auto& d : fs::directory_iterator(dir_ / "f/checkpoints"))
    EXPECT_EQ(d.path().filename().string().find(".tmp"), std::string::npos) << d.path();
}

TEST_F(TrainCommand, ConfigCommandPrintsResolvedKeysWithSources) {
  RunResult r = run_trainer("config " + write_config() + " --set optim.lr=0.2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("optim.lr"), std::string::npos);
  // The columns are as wide as the longest key and value: find optim.lr's line, then its value and source.
  const size_t line = r.output.find("\noptim.lr ");
  ASSERT_NE(line, std::string::npos) << r.output;
  const std::string row = r.output.substr(line + 1, r.output.find('\n', line + 1) - line - 1);
  EXPECT_NE(row.find(" 0.2 "), std::string::npos) << row;
  EXPECT_NE(row.find("[--set]"), std::string::npos) << row;
}

}  // namespace
