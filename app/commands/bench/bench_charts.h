#pragma once
// The charts of `trainer bench`: speedup.svg (speedup, efficiency and img/s with its 95% interval, or
// time to accuracy with its interval; points that did not reach the target or diverged are marked on
// the x axis with the reason) beside the older speedup.png. One curve per (precision, batch per rank).
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "app/commands/bench/bench_runs.h"

namespace trainer::bench {

struct BenchChartPoint {
  int procs = 1, batch = 0;
  std::string precision{};
  double speedup = NAN, efficiency = NAN;
  double value = NAN, ci95 = NAN;  // img/s (throughput) or seconds to the target (time to accuracy)
  std::string flag{};              // "not reached", "diverged": no value to draw
};

// The SVG file's text. to_accuracy: the third panel is time to accuracy in seconds, else img/s.
std::string bench_chart_svg(const std::vector<BenchChartPoint>& points, int max_procs, bool to_accuracy);

// Writes out/speedup.svg and out/speedup.png and prints where bench.csv, bench.json and the charts are.
void write_bench_chart_files(const std::filesystem::path& out, int max_procs, bool to_accuracy,
                             const std::vector<BenchChartPoint>& points);

// The one call of each bench mode: any point type derived from GridPoint with either img/s fields
// (ips, ips_half_width) or time-to-accuracy ones (reached(), diverged(), time_to_accuracy, train_seconds).
template <class Point>
void write_bench_charts(const std::filesystem::path& out, int max_procs, const std::vector<Point>& points) {
  std::vector<BenchChartPoint> chart;
  bool to_accuracy = false;
  for (const Point& p : points) {
    BenchChartPoint c{p.procs, p.batch, p.precision, p.speedup, p.efficiency};
    if constexpr (requires { p.ips_half_width; }) {
      c.value = p.ips;
      c.ci95 = p.ips_half_width;
    } else {
      to_accuracy = true;
      if (p.reached()) {
        c.value = p.time_to_accuracy.mean;
        c.ci95 = p.train_seconds.size() >= 2 ? p.time_to_accuracy.half_width : NAN;  // one repeat: none
      } else {
        c.flag = p.diverged() ? "diverged" : "not reached";
      }
    }
    chart.push_back(c);
  }
  write_bench_chart_files(out, max_procs, to_accuracy, chart);
}

}  // namespace trainer::bench
