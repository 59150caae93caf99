// speedup.svg of `trainer bench`: one curve per (precision, batch) on the speedup, efficiency and img/s
// panels, the img/s 95% interval drawn, single points written with their value, points that never
// reached the target or diverged marked on the x axis with the reason.
#include "app/commands/bench/bench_charts.h"

#include <gtest/gtest.h>

#include <string>

#include "trainer_process.h"

namespace trainer::bench {
namespace {

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(BenchCharts, ThroughputPanelDrawsTheIntervalOfEveryPoint) {
  const std::vector<BenchChartPoint> points = {{.procs = 1,
                                                .batch = 64,
                                                .precision = "fp32",
                                                .speedup = 1,
                                                .efficiency = 1,
                                                .value = 1000,
                                                .ci95 = 50},
                                               {.procs = 2,
                                                .batch = 64,
                                                .precision = "fp32",
                                                .speedup = 1.8,
                                                .efficiency = 0.9,
                                                .value = 1800,
                                                .ci95 = 90},
                                               {.procs = 1,
                                                .batch = 128,
                                                .precision = "fp32",
                                                .speedup = 1,
                                                .efficiency = 1,
                                                .value = 1500,
                                                .ci95 = 20}};
  const std::string svg = bench_chart_svg(points, 2, false);
  EXPECT_EQ(count_of(svg, "data-series=\"fp32-b64:img_per_s\""), 1u);
  EXPECT_EQ(count_of(svg, "data-series=\"fp32-b128:speedup\""), 1u);
  EXPECT_EQ(count_of(svg, "class=\"interval\""), 3u);
  EXPECT_NE(svg.find(">1500</text>"), std::string::npos);  // the single point of batch 128, with its value
  EXPECT_NE(svg.find("images/s (mean, 95% interval)"), std::string::npos);
  EXPECT_NE(svg.find("fp32, batch 128/rank"), std::string::npos);  // legend
}

TEST(BenchCharts, MarksPointsThatDidNotReachOrDiverged) {
  const std::vector<BenchChartPoint> points = {
      {.procs = 1, .batch = 32, .precision = "fp32", .speedup = 1, .efficiency = 1, .value = 20},
      {.procs = 2, .batch = 32, .precision = "fp32", .flag = "not reached"},
      {.procs = 4, .batch = 32, .precision = "fp32", .flag = "diverged"}};
  const std::string svg = bench_chart_svg(points, 4, true);
  EXPECT_EQ(count_of(svg, ">not reached</text>"), 3u);  // speedup, efficiency and time panels
  EXPECT_EQ(count_of(svg, ">diverged</text>"), 3u);
  EXPECT_NE(svg.find("Time to accuracy"), std::string::npos);
  EXPECT_EQ(count_of(svg, "class=\"interval\""), 0u);  // one repeat: no interval
}

class BenchChartFiles : public testing::TrainerRunTest {
 protected:
  BenchChartFiles() : TrainerRunTest("bench_charts_") {}
};

TEST_F(BenchChartFiles, BenchWritesTheSvgBesideThePng) {
  const std::string config = write_small_config("[train]\nepochs = 1\n");
  const auto out = dir_ / "bench";
  const auto r = testing::run_trainer("bench " + config +
                                      " --procs 1,2 --steps 3 --warmup 1 --repeats 2 --out " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("speedup.svg"), std::string::npos) << r.output;
  const std::string svg = testing::read_file(out / "speedup.svg");
  EXPECT_EQ(count_of(svg, "data-series=\"fp32-b32:img_per_s\""), 1u) << svg;
  EXPECT_EQ(count_of(svg, "class=\"interval\""), 2u) << svg;  // 2 repeats: an interval per point
  EXPECT_TRUE(std::filesystem::exists(out / "speedup.png"));
}

}  // namespace
}  // namespace trainer::bench
