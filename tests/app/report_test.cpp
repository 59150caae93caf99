// `trainer report`: what it reads from a run directory (metrics.csv when there, else train_steps.csv,
// step_times.csv, train.log's epoch lines and summary.json), the series it draws for each run, its
// default output paths and its message for a directory that is not a run directory.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "app/commands/report/report_html.h"
#include "app/commands/report/report_run.h"
#include "app/common/chart_svg.h"
#include "trainer_process.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A run directory as the trainer writes it today (no metrics.csv): 2 epochs of 4 steps, world size 2.
void write_run(const fs::path& dir, bool with_metrics) {
  fs::create_directories(dir);
  std::ofstream(dir / "config.toml") << "[data]\nbatch_size = 16\n[train]\ngrad_accum_steps = 1\n";
  std::ofstream steps(dir / "train_steps.csv");
  // The metrics.csv trainer also adds a wall_time column to train_steps.csv.
  steps << (with_metrics ? "wall_time,step,epoch,loss,lr\n" : "step,epoch,loss,lr\n");
  for (int s = 1; s <= 8; ++s)
    steps << (with_metrics ? std::to_string(1000 + s) + "," : "") << s << ',' << (s <= 4 ? 1 : 2) << ','
          << 2.3 - 0.1 * s << ",0.1\n";
  steps << "9,3,1.";  // a line still being written: left out
  std::ofstream times(dir / "step_times.csv");
  times
      << "step,step_seconds,data_wait_seconds,h2d_seconds,forward_seconds,backward_seconds,"
         "allreduce_exposed_seconds,optimizer_seconds,graph_seconds,allreduce_total_seconds,other_seconds\n";
  for (int s = 1; s <= 8; ++s) times << s << ",0.1,0.01,0.0,0.03,0.04,0.01,0.005,0,0.02,0.005\n";
  std::ofstream(dir / "train.log")
      << "device: cpu, run directory: x\n"
         "epoch 1/2: train loss 2.0000, 1.0s, 128 img/s | test loss 1.5000 top1 60.00% top5 95.00% (100 "
         "images, 0.1s)\n"
         "epoch 2/2: train loss 1.5000, 1.0s, 130 img/s | test loss 1.2000 top1 70.50% top5 97.00% auc 0.9 "
         "(100 images, 0.1s)\n";
  std::ofstream(dir / "summary.json") << "{\"epochs\": 2, \"world_size\": 2, \"final_test_accuracy\": 0.705, "
                                         "\"best_test_accuracy\": null, \"run_dir\": \"x\"}\n";
  if (with_metrics)
    std::ofstream(dir / "metrics.csv")
        << "wall_time,epoch,step,train_loss,eval_loss,eval_top1,eval_top5,eval_auc,"
           "lr,images_per_second,loss_scale\n"
           "10.5,1,4,2.0,1.4,0.61,0.95,,0.1,140,\n"
           "20.5,2,8,1.5,1.1,0.72,0.97,0.9,0.1,150,\n";
}

class ReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("report_test_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(ReportTest, ReadsTodaysRunDirectoryWithoutMetricsCsv) {
  write_run(dir_ / "a", false);
  const ReportRun r = read_report_run(dir_ / "a");
  EXPECT_EQ(r.name, "a");
  ASSERT_EQ(r.step.size(), 8u);  // the cut line left out
  EXPECT_DOUBLE_EQ(r.loss[0], 2.2);
  EXPECT_EQ(r.epochs_source, "train.log");
  ASSERT_EQ(r.epochs.size(), 2u);
  EXPECT_DOUBLE_EQ(r.epochs[1].top1, 0.705);
  EXPECT_DOUBLE_EQ(r.epochs[1].auc, 0.9);
  EXPECT_DOUBLE_EQ(r.epochs[1].step, 8);  // the epoch's last step, from train_steps.csv
  EXPECT_EQ(r.images_per_step, 32);       // batch 16 x world size 2
  EXPECT_EQ(r.summary.front().first, "epochs");
  EXPECT_EQ(r.summary[3].second, "n/a");
}

TEST_F(ReportTest, PrefersMetricsCsvForEpochs) {
  write_run(dir_ / "a", true);
  const ReportRun r = read_report_run(dir_ / "a");
  EXPECT_EQ(r.epochs_source, "metrics.csv");
  ASSERT_EQ(r.epochs.size(), 2u);
  EXPECT_DOUBLE_EQ(r.epochs[0].top1, 0.61);
  EXPECT_DOUBLE_EQ(r.epochs[1].wall_time, 20.5);
  ASSERT_EQ(r.wall_time.size(), 8u);
  EXPECT_DOUBLE_EQ(r.loss[7], 1.5);
}

TEST_F(ReportTest, PhaseSharesSumToOnePerWindow) {
  write_run(dir_ / "a", false);
  const PhaseWindows w = phase_windows(read_report_run(dir_ / "a"), 4);
  ASSERT_EQ(w.x.size(), 4u);  // 8 steps in windows of 2
  EXPECT_DOUBLE_EQ(w.x_end, 9);
  for (size_t i = 0; i < w.x.size(); ++i) {
    double total = 0;
    for (const auto& [name, share] : w.shares) total += share[i];
    EXPECT_NEAR(total, 1.0, 1e-9);
  }
  EXPECT_EQ(w.shares[3].first, "backward");
  EXPECT_NEAR(w.shares[3].second[0], 0.4, 1e-9);
}

TEST_F(ReportTest, DrawsEverySeriesOfEveryRun) {
  write_run(dir_ / "a", false);
  write_run(dir_ / "b", true);
  const std::string html = report_html({read_report_run(dir_ / "a"), read_report_run(dir_ / "b")});
  for (const char* run : {"r0", "r1"})
    for (const char* curve : {"loss", "eval_loss", "top1", "top5", "lr", "throughput", "throughput_epoch",
                              "phases:forward", "phases:data_wait", "phases:allreduce (exposed)"})
      EXPECT_EQ(count_of(html, std::string("data-series=\"") + run + ":" + curve + "\""), 1u) << run << curve;
  // Loss over wall-clock time: only the run whose train_steps.csv has wall_time.
  EXPECT_EQ(count_of(html, "data-series=\"r0:loss_wall\""), 0u);
  EXPECT_EQ(count_of(html, "data-series=\"r1:loss_wall\""), 1u);
  EXPECT_NE(html.find("<th>config data.batch_size</th><td>16</td>"), std::string::npos);
  for (const char* fetch : {"src=", "href=", "<link", "url(", "@import", "https://"})
    EXPECT_EQ(count_of(html, fetch), 0u) << fetch;  // self-contained: nothing is fetched
  EXPECT_NE(html.find("data-expected-series=\"" + std::to_string(count_of(html, "data-series=\"")) + "\""),
            std::string::npos);
}

TEST_F(ReportTest, RunsOfDifferentGlobalBatchesShareAnImagesAxis) {
  write_run(dir_ / "a", false);
  write_run(dir_ / "b", false);
  std::ofstream(dir_ / "b" / "config.toml") << "[data]\nbatch_size = 64\n";
  const std::string same = report_html({read_report_run(dir_ / "a"), read_report_run(dir_ / "a")});
  EXPECT_EQ(same.find("training images seen"), std::string::npos);
  const std::string mixed = report_html({read_report_run(dir_ / "a"), read_report_run(dir_ / "b")});
  EXPECT_EQ(count_of(mixed, ">training images seen (steps x global batch)</text>"), 3u);  // loss, lr, img/s
}

TEST_F(ReportTest, CommandWritesBesideOneRunAndNamesWhatIsMissing) {
  write_run(dir_ / "a", false);
  const auto one = testing::run_trainer("report " + (dir_ / "a").string());
  EXPECT_EQ(one.exit_code, 0) << one.output;
  EXPECT_TRUE(fs::exists(dir_ / "a" / "report.html"));
  fs::create_directories(dir_ / "empty");
  const auto bad = testing::run_trainer("report " + (dir_ / "a").string() + " " + (dir_ / "empty").string());
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.output.find((dir_ / "empty").string() + " is not a run directory: it has no train_steps.csv, "
                                                        "metrics.csv, train.log or summary.json"),
            std::string::npos)
      << bad.output;
  const auto none = testing::run_trainer("report");
  EXPECT_EQ(none.exit_code, 2) << none.output;
}

TEST_F(ReportTest, RunsOfTheSameNameAreToldApartByTheirParents) {
  write_run(dir_ / "x" / "run", false);
  write_run(dir_ / "y" / "run", false);
  const fs::path html = dir_ / "both.html";
  const auto r = testing::run_trainer("report " + (dir_ / "x" / "run").string() + " " +
                                      (dir_ / "y" / "run").string() + "/ --out " + html.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string page = testing::read_file(html);
  EXPECT_NE(page.find(">x/run train (per step)<"), std::string::npos);
  EXPECT_NE(page.find(">y/run train (per step)<"), std::string::npos);
}

TEST_F(ReportTest, ARunThatHasJustStartedGetsEmptyChartsNotFakeTicks) {
  fs::create_directories(dir_ / "new");
  std::ofstream(dir_ / "new" / "train.log") << "device: cpu\n";
  const ReportRun r = read_report_run(dir_ / "new");
  const std::string html = report_html({r});
  EXPECT_EQ(count_of(html, ">no data yet</text>"), 5u);  // loss, accuracy, lr, throughput, phases
  EXPECT_NE(html.find("no summary.json: the run is still training or was stopped"), std::string::npos);
  EXPECT_EQ(count_of(html, "data-series=\""), 0u);
}

TEST(ChartSvg, TicksAtRoundNumbers) {
  EXPECT_EQ(round_ticks(0, 0.93, 5, false), (std::vector<double>{0, 0.2, 0.4, 0.6, 0.8, 1.0}));
  EXPECT_EQ(round_ticks(3, 936, 5, true), (std::vector<double>{0, 200, 400, 600, 800, 1000}));
  EXPECT_EQ(round_ticks(1, 2, 5, true), (std::vector<double>{1, 2}));
  EXPECT_EQ(tick_label(0.25, 0.25), "0.25");
  EXPECT_EQ(tick_label(12000, 2000), "12k");
  EXPECT_EQ(tick_label(400, 100), "400");
}

TEST(ChartSvg, ASinglePointIsAMarkerWithItsValue) {
  SvgChart c{.title = "t", .x_label = "processes", .y_label = "images/s"};
  c.series.push_back({.name = "fp32", .id = "one", .x = {1}, .y = {1234.4}});
  const std::string svg = line_chart_svg(c);
  EXPECT_NE(svg.find("<circle"), std::string::npos);
  EXPECT_NE(svg.find(">1234</text>"), std::string::npos) << svg;
  EXPECT_EQ(svg.find("<polyline"), std::string::npos);
}

}  // namespace
}  // namespace trainer
