// The run directory's CSV files (metrics/run_csv.h) and train.log's timestamps (metrics/log.h).
#include "metrics/run_csv.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "metrics/log.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

std::string read_all(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class RunCsv : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("trainer_run_csv_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST(TrainStepsCsv, RowsEndWithTheWallClockInUnixSeconds) {
  EXPECT_EQ(train_steps_header(), "step,epoch,loss,lr,wall_time");
  EXPECT_EQ(train_steps_row(12, 2, 0.25, 0.1, 1764774245.5), "12,2,0.25,0.1,1764774245.500");
  const double now = unix_seconds_now();
  EXPECT_GT(now, 1.7e9);  // after 2023: seconds, not milliseconds
  EXPECT_LT(now, 4e9);
}

// A not-evaluated epoch leaves its eval cells empty, which pandas reads as NaN.
TEST(EpochMetricsRow, EmptyCellsForWhatWasNotMeasured) {
  EpochMetrics m;
  m.wall_time = 100.25;
  m.epoch = 3;
  m.step = 300;
  m.train_loss = 0.5;
  m.lr = 0.01;
  m.images_per_second = 1234.5;
  m.loss_scale = 65536;
  EXPECT_EQ(epoch_metrics_row(m), "100.250,3,300,0.5,,,,,0.01,1234.5,65536,,,");
  m.eval_loss = 0.4;
  m.eval_top1 = 0.9;
  m.eval_top5 = 0.99;
  EXPECT_EQ(epoch_metrics_row(m), "100.250,3,300,0.5,0.4,0.9,0.99,,0.01,1234.5,65536,,,");
  m.ema_eval_loss = 0.35;  // the weight average's evaluation (ema.enabled), its own columns
  m.ema_eval_top1 = 0.91;
  m.ema_eval_top5 = 0.995;
  EXPECT_EQ(epoch_metrics_row(m), "100.250,3,300,0.5,0.4,0.9,0.99,,0.01,1234.5,65536,0.35,0.91,0.995");
  EXPECT_EQ(epoch_metrics_header(),
            "wall_time,epoch,step,train_loss,eval_loss,eval_top1,eval_top5,eval_auc,lr,images_per_second,"
            "loss_scale,ema_eval_loss,ema_eval_top1,ema_eval_top5");
}

// Epoch rows carry the evaluation set before them, once; AUC NaN (not defined) stays empty.
TEST_F(RunCsv, EpochRowsTakeTheEvaluationOnce) {
  EpochMetricsCsv csv;
  csv.open(dir_.string(), 0, {});
  csv.set_eval({0.4, 0.9, 0.99, std::numeric_limits<double>::quiet_NaN()});
  csv.write_epoch(1, 10, 0.5, 0.1, 100, 1);
  csv.write_epoch(2, 20, 0.45, 0.1, 100, 1);
  csv.close();
  std::istringstream lines(read_all(dir_ / "metrics.csv"));
  std::string header, first, second;
  std::getline(lines, header);
  std::getline(lines, first);
  std::getline(lines, second);
  EXPECT_EQ(header, epoch_metrics_header());
  EXPECT_NE(first.find(",1,10,0.5,0.4,0.9,0.99,,0.1,100,1"), std::string::npos) << first;
  EXPECT_NE(second.find(",2,20,0.45,,,,,0.1,100,1"), std::string::npos) << second;
}

// A resumed run keeps the rows up to its checkpoint's step and appends after them, as train_steps.csv.
TEST_F(RunCsv, AResumedRunCutsBackToTheCheckpointAndAppends) {
  {
    EpochMetricsCsv csv;
    csv.open(dir_.string(), 0, {});
    for (int epoch = 1; epoch <= 3; ++epoch) csv.write_epoch(epoch, epoch * 10, 1.0 / epoch, 0.1, 100, 1);
    csv.close();
  }
  EpochMetricsCsv resumed;
  resumed.open(dir_.string(), 20, {});  // the checkpoint after epoch 2
  resumed.write_epoch(3, 30, 0.3, 0.1, 100, 1);
  resumed.close();
  const std::string text = read_all(dir_ / "metrics.csv");
  int rows = 0;
  for (char c : text) rows += c == '\n';
  EXPECT_EQ(rows, 4) << text;  // header + epochs 1, 2 and the new 3
  EXPECT_NE(text.find(",3,30,0.3,"), std::string::npos) << text;
  EXPECT_EQ(text.find(",3,30,0.333333333,"), std::string::npos) << text;
  // A fresh start in the same directory starts the file again.
  EpochMetricsCsv fresh;
  fresh.open(dir_.string(), 0, {});
  fresh.close();
  EXPECT_EQ(read_all(dir_ / "metrics.csv"), epoch_metrics_header() + "\n");
}

TEST(LogTimestamps, Iso8601UtcWithMilliseconds) {
  EXPECT_EQ(iso8601_utc(0), "1970-01-01T00:00:00.000Z");
  EXPECT_EQ(iso8601_utc(1764774245123), "2025-12-03T15:04:05.123Z");
  EXPECT_EQ(stamp_lines("a\nb", "T"), "T a\nT b");
  EXPECT_EQ(stamp_lines("one", "T"), "T one");
}

// Every line of the file starts with its time; the console keeps the bare line.
TEST_F(RunCsv, LogFileLinesStartWithTheirUtcTime) {
  Log& log = Log::instance();
  const std::string path = (dir_ / "train.log").string();
  log.open_file(path);
  log.set_print_lines(false);
  log.line("first line");
  log.line("table\nrow");
  log.close_file();
  log.set_print_lines(true);
  std::istringstream lines(read_all(path));
  int n = 0;
  for (std::string line; std::getline(lines, line); ++n) {
    ASSERT_GE(line.size(), 25u) << line;
    EXPECT_EQ(line[4], '-') << line;
    EXPECT_EQ(line[10], 'T') << line;
    EXPECT_EQ(line.substr(23, 2), "Z ") << line;
  }
  EXPECT_EQ(n, 3);
}

}  // namespace
}  // namespace trainer
