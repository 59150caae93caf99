#pragma once
// The pieces both `trainer bench` modes share (app/commands/bench/bench_command.cpp: steady-state throughput;
// app/commands/bench/bench_to_accuracy.cpp: time to a test accuracy): the parsed arguments, running one point
// as `trainer launch --nproc-per-node P -- train CONFIG --set ...` of this same binary in its own directory,
// reading what the run left there, the environment record and the speedup chart.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "app/common/build_info.h"
#include "app/common/format.h"
#include "app/common/json_text.h"
#include "app/common/system_info.h"
#include "app/config/config.h"

namespace trainer::bench {

struct BenchArgs {
  std::string config_path;
  std::vector<int> procs, batches;
  std::vector<std::string> precisions;
  int steps = 20, warmup = 5, repeats = 1;
  std::string data;          // "synthetic" | "real"; "" = the mode's default
  double to_accuracy = 0.0;  // > 0: time-to-accuracy mode
  std::string out;
  std::vector<std::string> overrides;
  bool help = false;
};

std::vector<std::string> split_list(const std::string& s);

double mean_of(const std::vector<double>& v);
double sum_of(const std::vector<double>& v);

// Overrides that make `config` train on random images of its dataset's shape.
std::vector<std::string> synthetic_overrides(const Config& c, int64_t samples);

// What every run of a point sets: its batch and precision, its own run directory, linear LR scaling, no
// checkpoints and no metrics exporter (ports would collide between concurrent ranks and benches).
std::vector<std::string> point_overrides(int batch, const std::string& precision,
                                         const std::filesystem::path& dir);

// Runs `trainer launch --nproc-per-node procs -- train CONFIG --set s...` (a free store port each time)
// with its output in dir/output.log. Throws with the log's last lines when the run fails. Returns the
// wall-clock seconds of the whole run (start-up and evaluation included).
double run_point(const std::string& config_path, int procs, const std::vector<std::string>& sets,
                 const std::filesystem::path& dir);

// The rows of a run's step_times.csv after `warmup` steps: column name -> values.
std::map<std::string, std::vector<double>> read_step_times(const std::filesystem::path& path, int warmup);

// A number from a run's summary.json (written by app/train/summary.cpp; null reads as NaN); throws, naming
// the file, when it is missing, not JSON, or has no number under `key`.
double summary_number(const std::filesystem::path& path, const std::string& key);

// The "environment" object of bench.json: build, host, CPU, GPUs, driver, CUDA/cuDNN/NCCL, NCCL_*.
nlohmann::ordered_json environment_json(const SystemInfo& s, const TrainerBuild& b);

// Writes out/bench.json: the bench's arguments (config, data, repeats, overrides), then `settings` (the
// mode's own: steps and warm-up, or the target accuracy), the environment and the `points` array.
void write_bench_json(const std::filesystem::path& out, const BenchArgs& a,
                      const nlohmann::ordered_json& settings, const nlohmann::ordered_json& points);

// One cell of the measurement grid: a precision, a batch per rank and a process count, with the global
// batch (x grad_accum_steps) and the linearly scaled LR (optim.lr x global / optim.base_batch_size).
// speedup and efficiency are against 1 process; NaN where there is nothing to plot.
struct GridPoint {
  int procs = 1, batch = 0;
  int64_t global_batch = 0;
  std::string precision;
  double lr = 0.0;
  double speedup = NAN, efficiency = NAN;
};
// The baseline of p's speedup: the point of p's precision and batch with the fewest processes (the
// 1-process point when it was measured). P derives from GridPoint; p is one of `points`.
template <class P>
const P& speedup_baseline(const std::vector<P>& points, const P& p) {
  const P* base = &p;
  for (const P& q : points)
    if (q.precision == p.precision && q.batch == p.batch && q.procs < base->procs) base = &q;
  return *base;
}
// Every cell, in run order: precisions, then batches, then process counts.
std::vector<GridPoint> measurement_grid(const Config& config, const BenchArgs& a,
                                        const std::vector<std::string>& precisions,
                                        const std::vector<int>& batches);
// The emptied directory of repeat `repeat` of grid point p under out: pP-bB-PRECISION-rR.
std::filesystem::path fresh_run_dir(const std::filesystem::path& out, const GridPoint& p, int repeat);

// A point of bench.json with its grid fields: procs, batch_per_rank, global_batch, precision, lr; each
// mode adds its measurements.
nlohmann::ordered_json grid_point_json(const GridPoint& p);

// "bench: [3/8] 2 processes, batch 128/rank, bf16, repeat 1/2 ... " (no newline; flushed).
void print_run_start(size_t index, size_t count, const GridPoint& p, int repeat, int repeats);

// One line per (precision, batch) in the speedup and efficiency panels.
struct SpeedupCurve {
  std::vector<double> procs, speedup, efficiency;
};
std::string speedup_chart_png(double max_procs, const std::vector<SpeedupCurve>& curves);
void write_chart_file(const std::filesystem::path& path, const std::string& png);

// Writes out/speedup.png from the points (any type derived from GridPoint; NaN speedups are left out)
// and prints where bench.csv, bench.json and the chart are.
template <class Point>
void write_chart_and_report(const std::filesystem::path& out, int max_procs,
                            const std::vector<std::string>& precisions, const std::vector<int>& batches,
                            const std::vector<Point>& points) {
  std::vector<SpeedupCurve> curves;
  for (const std::string& precision : precisions)
    for (int batch : batches) {
      SpeedupCurve c;
      for (const GridPoint& p : points)
        if (p.precision == precision && p.batch == batch && !std::isnan(p.speedup)) {
          c.procs.push_back(p.procs);
          c.speedup.push_back(p.speedup);
          c.efficiency.push_back(p.efficiency);
        }
      curves.push_back(c);
    }
  write_chart_file(out / "speedup.png", speedup_chart_png(static_cast<double>(max_procs), curves));
  std::printf("\nwrote %s, %s, %s\n", (out / "bench.csv").c_str(), (out / "bench.json").c_str(),
              (out / "speedup.png").c_str());
}

}  // namespace trainer::bench
