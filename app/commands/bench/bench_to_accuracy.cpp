#include "app/commands/bench/bench_to_accuracy.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "app/commands/bench/bench_charts.h"
#include "app/commands/bench/bench_command.h"
#include "app/common/format.h"
#include "app/train/divergence.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;
using namespace bench;

struct AccuracyPoint : GridPoint {
  int repeats_reached = 0;
  std::vector<double> train_seconds, wall_seconds, best_accuracy;  // per repeat
  std::vector<int> epochs;                                         // per repeat
  std::vector<std::string> divergence;  // per repeat: how it diverged (loss, accuracy at chance) or ""
  double allreduce_exposed = 0.0, data_wait = 0.0, step_total = 0.0;  // summed seconds
  MeanInterval time_to_accuracy;  // speedup, efficiency: NaN when this point or its baseline did not reach
  std::vector<std::string> run_dirs;
  bool reached() const { return repeats_reached == static_cast<int>(epochs.size()); }
  bool diverged() const {
    for (const std::string& d : divergence)
      if (!d.empty()) return true;
    return false;
  }
};

std::string csv_number(double v, const char* f) { return std::isnan(v) ? "" : fmt(f, v); }

std::vector<double> rounded_all(const std::vector<double>& v, int decimals) {
  std::vector<double> out;
  for (double x : v) out.push_back(rounded(x, decimals));
  return out;
}

// The first line of a run's output that holds `marker`, without the "trainer: error: " in front; "" when
// there is none.
std::string line_with(const fs::path& log, const std::string& marker) {
  std::ifstream in(log);
  for (std::string line; std::getline(in, line);) {
    if (line.find(marker) == std::string::npos) continue;
    if (const size_t at = line.find("error: "); at != std::string::npos) line.erase(0, at + 7);
    return line;
  }
  return "";
}

// One run of a point: train to the target, read its summary and step times. Whether it reached it. A run
// that stopped because its loss became non-finite is a diverged point, not a failed bench.
bool run_repeat(const BenchArgs& a, const Config& config, AccuracyPoint& p, const fs::path& dir) {
  std::vector<std::string> sets = a.overrides;
  if (a.data == "synthetic" && config.data.dataset != "synthetic") {
    const auto s = synthetic_overrides(config, config.data.synthetic_samples);
    sets.insert(sets.end(), s.begin(), s.end());
  }
  const auto fixed = point_overrides(p.batch, p.precision, dir);
  sets.insert(sets.end(), fixed.begin(), fixed.end());
  sets.push_back(fmt("train.target_accuracy=%.17g", a.to_accuracy));
  sets.push_back("train.eval_every_epochs=1");
  const auto start = std::chrono::steady_clock::now();
  try {
    p.wall_seconds.push_back(run_point(a.config_path, p.procs, sets, dir));
  } catch (const std::runtime_error&) {
    const std::string diverged = line_with(dir / "output.log", kDivergedMarker);
    if (diverged.empty()) throw;
    p.wall_seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    p.epochs.push_back(0);
    p.best_accuracy.push_back(0.0);
    p.divergence.push_back(diverged.substr(0, diverged.find(". HINT")));
    p.run_dirs.push_back(dir.string());
    return false;
  }
  const fs::path summary = dir / "summary.json";
  const double best = summary_number(summary, "best_test_accuracy");
  // The loop stopped right after the epoch that reached the target: its epochs and training seconds
  // are the time to accuracy. (summary.json holds best in full; the slack is only a safety margin.)
  const bool reached = best >= a.to_accuracy - 1e-9;
  p.repeats_reached += reached ? 1 : 0;
  p.epochs.push_back(static_cast<int>(summary_number(summary, "epochs")));
  p.best_accuracy.push_back(best);
  if (reached) p.train_seconds.push_back(summary_number(summary, "train_seconds"));
  const bool at_chance = !reached && !line_with(dir / "output.log", kAtChanceMarker).empty();
  p.divergence.push_back(at_chance ? fmt("test top-1 %.2f%% is at chance after the warm-up", 100 * best)
                                   : "");
  auto cols = read_step_times(dir / "step_times.csv", 0);
  p.step_total += sum_of(cols["step_seconds"]);
  p.allreduce_exposed += sum_of(cols["allreduce_exposed_seconds"]);
  p.data_wait += sum_of(cols["data_wait_seconds"]);
  p.run_dirs.push_back(dir.string());
  return reached;
}

double fraction(double part, double total) { return total > 0 ? part / total : 0.0; }

// The line that ends a repeat's "bench: [i/n] ..." line.
void print_repeat_result(const AccuracyPoint& p, bool reached) {
  if (reached)
    std::printf("%.2f%% after %d epoch%s, %.1fs of training (%.1fs in all)\n", 100 * p.best_accuracy.back(),
                p.epochs.back(), p.epochs.back() == 1 ? "" : "s", p.train_seconds.back(),
                p.wall_seconds.back());
  else if (p.epochs.back() == 0)  // stopped by a non-finite loss before its first evaluation
    std::printf("diverged: %s (%.1fs in all). HINT: %s\n", p.divergence.back().c_str(), p.wall_seconds.back(),
                divergence_hint(true, p.global_batch, p.lr).c_str());
  else
    std::printf("not reached: best %.2f%% in %d epochs (%.1fs in all)%s\n", 100 * p.best_accuracy.back(),
                p.epochs.back(), p.wall_seconds.back(),
                p.divergence.back().empty() ? ""
                                            : (": diverged, " + p.divergence.back() +
                                               ". HINT: " + divergence_hint(true, p.global_batch, p.lr))
                                                  .c_str());
  std::fflush(stdout);
}

// Runs every repeat of one grid cell; run_index counts the runs of the whole bench.
AccuracyPoint measure_point(const GridPoint& cell, const BenchArgs& a, const Config& config,
                            const fs::path& out, size_t& run_index, size_t n_runs) {
  AccuracyPoint p;
  static_cast<GridPoint&>(p) = cell;
  for (int r = 1; r <= a.repeats; ++r) {
    const fs::path dir = fresh_run_dir(out, p, r);
    print_run_start(++run_index, n_runs, p, r, a.repeats);
    bool reached = false;
    try {
      reached = run_repeat(a, config, p, dir);
    } catch (...) {
      std::printf("failed\n");
      throw;
    }
    print_repeat_result(p, reached);
  }
  if (p.reached()) p.time_to_accuracy = mean_interval95(p.train_seconds);
  return p;
}

// Speedup in time to accuracy over the fewest processes of the same precision and batch.
void compute_speedups(std::vector<AccuracyPoint>& points) {
  for (AccuracyPoint& p : points) {
    const AccuracyPoint& base = speedup_baseline(points, p);
    if (!p.reached() || !base.reached()) continue;
    p.speedup = base.time_to_accuracy.mean / p.time_to_accuracy.mean;
    p.efficiency = p.speedup / (static_cast<double>(p.procs) / base.procs);
  }
}

// The table's time-to-accuracy column, right-aligned in 24 columns.
std::string time_to_accuracy_cell(const AccuracyPoint& p) {
  std::string tta = p.diverged() ? "diverged" : "not reached";
  if (p.reached()) {
    // One repeat has no interval: say so rather than print a misleading ± 0.
    tta = p.train_seconds.size() >= 2
              ? fmt("%.2f s ± %.2f", p.time_to_accuracy.mean, p.time_to_accuracy.half_width)
              : fmt("%.2f s ± n/a", p.time_to_accuracy.mean);
    tta.insert(0, tta.size() - 1 < 24 ? 24 - (tta.size() - 1) : 0, ' ');  // '±' is 2 bytes, 1 column
  } else {
    tta.insert(0, 24 - tta.size(), ' ');
  }
  return tta;
}

// Prints the results table and writes the same rows to out/bench.csv.
void write_table_and_csv(const std::vector<AccuracyPoint>& points, const BenchArgs& a, const fs::path& out) {
  std::printf("\n%5s %10s %7s %9s %9s %7s %7s %24s %9s %9s %8s %10s %18s %9s\n", "procs", "batch/rank",
              "global", "precision", "lr", "target", "epochs", "time to accuracy (95% CI)", "wall s",
              "best top1", "speedup", "efficiency", "allreduce_exposed", "data_wait");
  std::ostringstream csv;
  csv << "procs,batch_per_rank,global_batch,precision,lr,target_accuracy,reached,epochs,"
         "time_to_accuracy_seconds,time_to_accuracy_ci95,wall_seconds,best_test_accuracy,speedup,efficiency,"
         "allreduce_exposed_pct,data_wait_pct,repeats,diverged\n";
  for (const AccuracyPoint& p : points) {
    const double ar = 100 * fraction(p.allreduce_exposed, p.step_total);
    const double dw = 100 * fraction(p.data_wait, p.step_total);
    const double epochs = mean_of(std::vector<double>(p.epochs.begin(), p.epochs.end()));
    const double wall = mean_of(p.wall_seconds), best = mean_of(p.best_accuracy);
    std::printf("%5d %10d %7lld %9s %9.4g %6.2f%% %7.3g %s %9.1f %8.2f%% %8s %10s %17.1f%% %8.1f%%\n",
                p.procs, p.batch, static_cast<long long>(p.global_batch), p.precision.c_str(), p.lr,
                100 * a.to_accuracy, epochs, time_to_accuracy_cell(p).c_str(), wall, 100 * best,
                std::isnan(p.speedup) ? "-" : fmt("%.2f", p.speedup).c_str(),
                std::isnan(p.efficiency) ? "-" : fmt("%.1f%%", 100 * p.efficiency).c_str(), ar, dw);
    csv << p.procs << ',' << p.batch << ',' << p.global_batch << ',' << p.precision << ','
        << fmt("%.6g", p.lr) << ',' << fmt("%.6g", a.to_accuracy) << ',' << (p.reached() ? "true" : "false")
        << ',' << fmt("%g", epochs) << ','
        << (p.reached() ? fmt("%.4f", p.time_to_accuracy.mean) : std::string()) << ','
        << (p.reached() && p.train_seconds.size() >= 2 ? fmt("%.4f", p.time_to_accuracy.half_width)
                                                       : std::string())
        << ',' << fmt("%.3f", wall) << ',' << fmt("%.6f", best) << ',' << csv_number(p.speedup, "%.4f") << ','
        << csv_number(p.efficiency, "%.4f") << ',' << fmt("%.2f", ar) << ',' << fmt("%.2f", dw) << ','
        << a.repeats << ',' << (p.diverged() ? "true" : "false") << '\n';
  }
  std::ofstream(out / "bench.csv") << csv.str();
}

nlohmann::ordered_json point_json(const AccuracyPoint& p) {
  nlohmann::ordered_json j = grid_point_json(p);
  j["reached"] = p.reached();
  j["diverged"] = p.diverged();
  j["divergence"] = p.divergence;
  j["epochs"] = p.epochs;
  // null (NaN) where the target was not reached, or with one repeat for the interval.
  j["time_to_accuracy_seconds"] = p.reached() ? rounded(p.time_to_accuracy.mean, 4) : NAN;
  j["time_to_accuracy_ci95"] =
      p.reached() && p.train_seconds.size() >= 2 ? rounded(p.time_to_accuracy.half_width, 4) : NAN;
  j["repeat_train_seconds"] = rounded_all(p.train_seconds, 4);
  j["wall_seconds"] = rounded_all(p.wall_seconds, 3);
  j["best_test_accuracy"] = rounded_all(p.best_accuracy, 6);
  j["speedup"] = rounded(p.speedup, 4);
  j["efficiency"] = rounded(p.efficiency, 4);
  j["allreduce_exposed_fraction"] = rounded(fraction(p.allreduce_exposed, p.step_total), 4);
  j["data_wait_fraction"] = rounded(fraction(p.data_wait, p.step_total), 4);
  j["run_dirs"] = p.run_dirs;
  return j;
}

// The chart plots only points that reached the target, as did their baseline: says which are missing.
void note_left_out_of_chart(const std::vector<AccuracyPoint>& points) {
  for (const AccuracyPoint& p : points)
    if (std::isnan(p.speedup))
      std::printf("note: speedup.png leaves out %d process%s, batch %d/rank, %s: %s\n", p.procs,
                  p.procs == 1 ? "" : "es", p.batch, p.precision.c_str(),
                  p.diverged()  ? "diverged"
                  : p.reached() ? "its baseline did not reach the target"
                                : "target not reached");
}

}  // namespace

int bench_to_accuracy(const BenchArgs& a, const Config& config, const std::vector<std::string>& precisions,
                      const std::vector<int>& batches, const fs::path& out) {
  const size_t n_runs = precisions.size() * batches.size() * a.procs.size() * static_cast<size_t>(a.repeats);
  std::printf("bench: %s, %zu runs to test top-1 %.2f%% (at most %d epochs each), data %s, into %s\n",
              a.config_path.c_str(), n_runs, 100 * a.to_accuracy, config.train.epochs, a.data.c_str(),
              out.c_str());
  std::fflush(stdout);
  std::vector<AccuracyPoint> points;
  size_t run_index = 0;
  for (const GridPoint& cell : measurement_grid(config, a, precisions, batches))
    points.push_back(measure_point(cell, a, config, out, run_index, n_runs));
  compute_speedups(points);

  write_table_and_csv(points, a, out);
  nlohmann::ordered_json json_points = nlohmann::ordered_json::array();
  for (const AccuracyPoint& p : points) json_points.push_back(point_json(p));
  const nlohmann::ordered_json settings = {{"mode", "time_to_accuracy"},
                                           {"target_accuracy", significant(a.to_accuracy, 6)},
                                           {"max_epochs", config.train.epochs}};
  write_bench_json(out, a, settings, json_points);
  write_bench_charts(out, a.procs.back(), points);
  note_left_out_of_chart(points);
  return 0;
}

}  // namespace trainer
