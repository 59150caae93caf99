#include "app/commands/bench/bench_command.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>

#include "app/commands/bench/bench_charts.h"
#include "app/commands/bench/bench_runs.h"
#include "app/commands/bench/bench_to_accuracy.h"
#include "app/common/cli.h"
#include "app/common/format.h"
#include "app/config/config.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;
using namespace bench;

const char* kBenchUsage =
    "usage: trainer bench CONFIG --procs 1,2,4 [--precisions fp32,tf32] [--batch 128,512]\n"
    "                    [--steps N] [--warmup N] [--repeats R] [--data synthetic|real] [--out DIR]\n"
    "                    [--to-accuracy X] [--set section.key=value ...]\n\n"
    "Measures training throughput of CONFIG at each number of local processes (and precision and per-rank\n"
    "batch): every point is `trainer launch --nproc-per-node P -- train CONFIG` with train.max_steps =\n"
    "warmup + steps (the LR schedule still spans the config's train.epochs, as in a full run), evaluation\n"
    "only at the end (not timed), no checkpoints, optim.lr_scaling = linear and its own train.run_dir under\n"
    "the bench directory. Rank 0's step_times.csv gives the steady-state step\n"
    "time (warm-up steps dropped): img/s = global batch / mean step time, with a 95% interval over the\n"
    "repeats (Student's t; with one repeat, over the steps), and the share of the step spent waiting for\n"
    "the all-reduce after backward and for data. Speedup is over the 1-process point of the same precision\n"
    "and batch (or the fewest processes measured); efficiency = speedup / (P / that count).\n\n"
    "  --procs LIST         processes per point, e.g. 1,2,4 (required)\n"
    "  --precisions LIST    train.precision values (default: the config's)\n"
    "  --batch LIST         per-rank data.batch_size values (default: the config's)\n"
    "  --steps N            timed steps per run (default 20)\n"
    "  --warmup N           untimed steps first (default 5)\n"
    "  --repeats R          runs per point (default 1)\n"
    "  --data synthetic|real  synthetic (default without --to-accuracy) replaces the dataset by random\n"
    "                       images of its shape; real (default with --to-accuracy) reads the config's "
    "dataset\n"
    "  --out DIR            bench directory (default runs/bench-<config>-<time>)\n"
    "  --set k=v            passed to every run's `train`\n"
    "  --to-accuracy X      time to accuracy instead of throughput: each run trains until the test top-1\n"
    "                       reaches X (a fraction, e.g. 0.9), evaluating after every epoch, for at most\n"
    "                       train.epochs epochs (train.target_accuracy = X); --steps and --warmup do not\n"
    "                       apply. Reports epochs and training seconds (evaluation excluded) to reach X,\n"
    "                       or 'not reached', and the speedup from those seconds\n\n"
    "Writes bench.csv, bench.json (results + build, host, CPU, GPUs, driver, CUDA/cuDNN versions and every\n"
    "NCCL_* variable) and speedup.png into the bench directory; each run's output is in its\n"
    "<point>/output.log.\n\n"
    "example: trainer bench configs/fashion_mnist_cnn.toml --procs 1,2 --steps 20 --warmup 5\n";

int parse_positive(const std::string& flag, const std::string& value) {
  int v = 0;
  const char* end = value.data() + value.size();
  auto [p, ec] = std::from_chars(value.data(), end, v);
  if (value.empty() || ec != std::errc() || p != end || v < 1)
    throw UsageError(flag + " expects a positive whole number, got '" + value + "'");
  return v;
}

BenchArgs parse_bench_args(const std::vector<std::string>& args) {
  BenchArgs a;
  ArgWalker w(args);
  while (w.next()) {
    const std::string& arg = w.arg();
    if (arg == "--help" || arg == "-h") {
      a.help = true;
    } else if (arg == "--procs") {
      a.procs.clear();
      for (const auto& p : split_list(w.value())) a.procs.push_back(parse_positive(arg, p));
    } else if (arg == "--batch") {
      a.batches.clear();
      for (const auto& b : split_list(w.value())) a.batches.push_back(parse_positive(arg, b));
    } else if (arg == "--precisions") {
      a.precisions = split_list(w.value());
    } else if (arg == "--steps") {
      a.steps = parse_positive(arg, w.value());
    } else if (arg == "--warmup") {
      const std::string v = w.value();
      a.warmup = v == "0" ? 0 : parse_positive(arg, v);
    } else if (arg == "--repeats") {
      a.repeats = parse_positive(arg, w.value());
    } else if (arg == "--data") {
      a.data = w.value();
      if (a.data != "synthetic" && a.data != "real")
        throw UsageError("--data expects synthetic or real, got '" + a.data + "'");
    } else if (arg == "--out") {
      a.out = w.value();
    } else if (arg == "--set") {
      a.overrides.push_back(set_override(w.value()));
    } else if (arg == "--to-accuracy") {
      const std::string v = w.value();
      char* end = nullptr;
      a.to_accuracy = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(a.to_accuracy > 0 && a.to_accuracy <= 1))
        throw UsageError("--to-accuracy expects a test top-1 fraction in (0, 1], e.g. 0.9 for 90%, got '" +
                         v + "'");
    } else {
      w.config_or_unknown(a.config_path);
    }
  }
  if (a.help) return a;
  if (a.config_path.empty())
    throw UsageError("missing CONFIG (a TOML file, e.g. configs/fashion_mnist_cnn.toml)");
  if (a.procs.empty()) throw UsageError("--procs LIST is required, e.g. --procs 1,2,4");
  if (a.data.empty()) a.data = a.to_accuracy > 0 ? "real" : "synthetic";
  std::sort(a.procs.begin(), a.procs.end());
  a.procs.erase(std::unique(a.procs.begin(), a.procs.end()), a.procs.end());
  return a;
}

struct Point : GridPoint {
  std::vector<double> repeat_ips;                                     // img/s of each repeat
  std::vector<double> step_seconds;                                   // every steady step of every repeat
  double allreduce_exposed = 0.0, data_wait = 0.0, step_total = 0.0;  // summed seconds
  double ips = 0.0, ips_half_width = 0.0;
  std::vector<std::string> run_dirs;
};

void summarise(Point& p) {
  if (p.repeat_ips.size() >= 2) {
    const MeanInterval m = mean_interval95(p.repeat_ips);
    p.ips = m.mean;
    p.ips_half_width = m.half_width;
  } else {
    // One repeat: the interval of the mean step time over the steps, carried through G / t.
    const MeanInterval t = mean_interval95(p.step_seconds);
    const double g = static_cast<double>(p.global_batch);
    p.ips = g / t.mean;
    const double lo = g / (t.mean + t.half_width);
    const double hi = t.half_width < t.mean ? g / (t.mean - t.half_width) : 2 * p.ips - lo;
    p.ips_half_width = (hi - lo) / 2;
  }
}

// What repeat `dir` of point p sets on top of the user's --set: a data set that holds the run, the
// point's batch, precision and directory, and the step count.
std::vector<std::string> throughput_overrides(const BenchArgs& a, const Config& config, const Point& p,
                                              const fs::path& dir, int total_steps) {
  std::vector<std::string> sets = a.overrides;
  // Synthetic data: one epoch holds the run. train.epochs stays the config's, so the LR schedule (its
  // warm-up above all) spans as many epochs as in a full run and max_steps only stops it there.
  if (a.data == "synthetic" && config.data.dataset != "synthetic") {
    const auto s = synthetic_overrides(config, p.global_batch * total_steps);
    sets.insert(sets.end(), s.begin(), s.end());
  } else if (a.data == "synthetic") {
    sets.push_back("data.synthetic_samples=" + std::to_string(p.global_batch * total_steps));
  } else {
    sets.push_back("train.epochs=1000000");
  }
  const auto fixed = point_overrides(p.batch, p.precision, dir);
  sets.insert(sets.end(), fixed.begin(), fixed.end());
  sets.push_back("train.max_steps=" + std::to_string(total_steps));
  sets.push_back("train.eval_every_epochs=0");
  return sets;
}

// Adds the steady-state steps of the run in dir (its step_times.csv after the warm-up) to p.
void add_repeat(Point& p, const fs::path& dir, int warmup, int total_steps) {
  auto cols = read_step_times(dir / "step_times.csv", warmup);
  const std::vector<double>& steps = cols["step_seconds"];
  if (steps.empty())
    throw std::runtime_error("bench: " + (dir / "step_times.csv").string() +
                             " has no step after the warm-up. HINT: the dataset may be smaller than " +
                             std::to_string(total_steps) + " global batches; lower --steps/--warmup");
  const double mean_step = mean_of(steps);
  p.repeat_ips.push_back(static_cast<double>(p.global_batch) / mean_step);
  p.step_seconds.insert(p.step_seconds.end(), steps.begin(), steps.end());
  p.step_total += sum_of(steps);
  p.allreduce_exposed += sum_of(cols["allreduce_exposed_seconds"]);
  p.data_wait += sum_of(cols["data_wait_seconds"]);
  p.run_dirs.push_back(dir.string());
}

// Runs every repeat of one grid cell; run_index counts the runs of the whole bench.
Point measure_point(const GridPoint& cell, const BenchArgs& a, const Config& config, const fs::path& out,
                    size_t& run_index, size_t n_runs) {
  const int total_steps = a.warmup + a.steps;
  Point p;
  static_cast<GridPoint&>(p) = cell;
  for (int r = 1; r <= a.repeats; ++r) {
    const fs::path dir = fresh_run_dir(out, p, r);
    const std::vector<std::string> sets = throughput_overrides(a, config, p, dir, total_steps);
    print_run_start(++run_index, n_runs, p, r, a.repeats);
    double secs = 0;
    try {
      secs = run_point(a.config_path, p.procs, sets, dir);
    } catch (...) {
      std::printf("failed\n");
      throw;
    }
    add_repeat(p, dir, a.warmup, total_steps);
    std::printf("%.0f img/s (%.1fs)\n", p.repeat_ips.back(), secs);
    std::fflush(stdout);
  }
  summarise(p);
  return p;
}

// Speedup over the fewest processes of the same precision and batch (1 when measured).
void compute_speedups(std::vector<Point>& points) {
  for (Point& p : points) {
    const Point& base = speedup_baseline(points, p);
    p.speedup = p.ips / base.ips;
    p.efficiency = p.speedup / (static_cast<double>(p.procs) / base.procs);
  }
}

// Prints the results table and writes the same rows to out/bench.csv.
void write_table_and_csv(const std::vector<Point>& points, const BenchArgs& a, const fs::path& out) {
  std::printf("\n%5s %10s %7s %9s %9s %20s %8s %10s %18s %9s\n", "procs", "batch/rank", "global", "precision",
              "lr", "img/s (95% CI)", "speedup", "efficiency", "allreduce_exposed", "data_wait");
  std::ostringstream csv;
  csv << "procs,batch_per_rank,global_batch,precision,lr,img_per_s,img_per_s_ci95,speedup,efficiency,"
         "allreduce_exposed_pct,data_wait_pct,mean_step_seconds,repeats,steps,warmup\n";
  for (const Point& p : points) {
    const double ar = 100 * p.allreduce_exposed / p.step_total, dw = 100 * p.data_wait / p.step_total;
    std::string ips = fmt("%.1f ± %.1f", p.ips, p.ips_half_width);
    ips.insert(0, ips.size() - 1 < 20 ? 20 - (ips.size() - 1) : 0, ' ');  // '±' is 2 bytes, 1 column
    std::printf("%5d %10d %7lld %9s %9.4g %s %8.2f %9.1f%% %17.1f%% %8.1f%%\n", p.procs, p.batch,
                static_cast<long long>(p.global_batch), p.precision.c_str(), p.lr, ips.c_str(), p.speedup,
                100 * p.efficiency, ar, dw);
    csv << p.procs << ',' << p.batch << ',' << p.global_batch << ',' << p.precision << ','
        << fmt("%.6g", p.lr) << ',' << fmt("%.2f", p.ips) << ',' << fmt("%.2f", p.ips_half_width) << ','
        << fmt("%.4f", p.speedup) << ',' << fmt("%.4f", p.efficiency) << ',' << fmt("%.2f", ar) << ','
        << fmt("%.2f", dw) << ',' << fmt("%.6g", mean_of(p.step_seconds)) << ',' << a.repeats << ','
        << a.steps << ',' << a.warmup << '\n';
  }
  std::ofstream(out / "bench.csv") << csv.str();
}

nlohmann::ordered_json point_json(const Point& p) {
  nlohmann::ordered_json j = grid_point_json(p);
  j["img_per_s"] = rounded(p.ips, 3);
  j["img_per_s_ci95"] = rounded(p.ips_half_width, 3);
  j["repeat_img_per_s"] = nlohmann::ordered_json::array();
  for (double ips : p.repeat_ips) j["repeat_img_per_s"].push_back(rounded(ips, 3));
  j["speedup"] = rounded(p.speedup, 4);
  j["efficiency"] = rounded(p.efficiency, 4);
  j["mean_step_seconds"] = significant(mean_of(p.step_seconds), 6);
  j["allreduce_exposed_fraction"] = rounded(p.allreduce_exposed / p.step_total, 4);
  j["data_wait_fraction"] = rounded(p.data_wait / p.step_total, 4);
  j["run_dirs"] = p.run_dirs;
  return j;
}

// The bench directory: --out, or runs/bench-<config>-<time>.
fs::path bench_directory(const BenchArgs& a) {
  if (!a.out.empty()) return fs::path(a.out);
  return fs::path("runs") / ("bench-" + fs::path(a.config_path).stem().string() +
                             fmt("-%lld", static_cast<long long>(std::time(nullptr))));
}

// Steady-state throughput at every grid point: the table, bench.csv, bench.json and speedup.png.
int bench_throughput(const BenchArgs& a, const Config& config, const std::vector<std::string>& precisions,
                     const std::vector<int>& batches, const fs::path& out) {
  const size_t n_runs = precisions.size() * batches.size() * a.procs.size() * static_cast<size_t>(a.repeats);
  std::printf("bench: %s, %zu runs of %d steps (%d warm-up), data %s, into %s\n", a.config_path.c_str(),
              n_runs, a.warmup + a.steps, a.warmup, a.data.c_str(), out.c_str());
  std::fflush(stdout);
  std::vector<Point> points;
  size_t run_index = 0;
  for (const GridPoint& cell : measurement_grid(config, a, precisions, batches))
    points.push_back(measure_point(cell, a, config, out, run_index, n_runs));
  compute_speedups(points);

  write_table_and_csv(points, a, out);
  nlohmann::ordered_json json_points = nlohmann::ordered_json::array();
  for (const Point& p : points) json_points.push_back(point_json(p));
  write_bench_json(out, a, {{"steps", a.steps}, {"warmup", a.warmup}}, json_points);
  // One line per (precision, batch).
  write_bench_charts(out, a.procs.back(), points);
  return 0;
}

}  // namespace

double student_t975(int dof) {
  static const double t[] = {0,     12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                             2.201, 2.179,  2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080,
                             2.074, 2.069,  2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042};
  if (dof < 1) return 0.0;
  return dof <= 30 ? t[dof] : 1.96;
}

MeanInterval mean_interval95(const std::vector<double>& v) {
  MeanInterval m;
  m.mean = mean_of(v);
  if (v.size() < 2) return m;
  double ss = 0;
  for (double x : v) ss += (x - m.mean) * (x - m.mean);
  const double sd = std::sqrt(ss / static_cast<double>(v.size() - 1));
  m.half_width = student_t975(static_cast<int>(v.size()) - 1) * sd / std::sqrt(static_cast<double>(v.size()));
  return m;
}

int bench_command(const std::vector<std::string>& args) {
  const BenchArgs a = parse_bench_args(args);
  if (a.help) {
    std::cout << kBenchUsage;
    return 0;
  }
  const Config config = load_config(a.config_path, a.overrides);
  const std::vector<std::string> precisions =
      a.precisions.empty() ? std::vector<std::string>{std::string(precision_name(config.train.precision))}
                           : a.precisions;
  const std::vector<int> batches = a.batches.empty() ? std::vector<int>{config.data.batch_size} : a.batches;
  for (const std::string& p : precisions) load_config(a.config_path, {"train.precision=" + p});  // validates
  const fs::path out = bench_directory(a);
  fs::create_directories(out);
  if (a.to_accuracy > 0) return bench_to_accuracy(a, config, precisions, batches, out);
  return bench_throughput(a, config, precisions, batches, out);
}

}  // namespace trainer
