#pragma once
// What `trainer report` reads from one run directory: the per-step and per-epoch curves, the phase
// seconds of every step and summary.json, from whichever of the trainer's files the run has. A run still
// training, or written by an older trainer, lacks some; the report draws what there is and says what
// it fell back to.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace trainer {

struct ReportEpoch {
  int epoch = 0;
  double step = NAN;  // the last optimizer step of the epoch (x of the per-epoch points on step axes)
  double train_loss = NAN, eval_loss = NAN, top1 = NAN, top5 = NAN, auc = NAN;  // accuracies as fractions
  double images_per_second = NAN, wall_time = NAN;
};

struct ReportRun {
  std::string name;  // the directory's name, the legend text
  std::filesystem::path dir;
  // train_steps.csv: one entry per optimizer step.
  std::vector<double> step, epoch_of_step, loss, lr;
  std::vector<double> wall_time;  // train_steps.csv's wall_time column when the trainer writes one
  // metrics.csv when present, else train.log's "epoch N/M: ..." lines.
  std::vector<ReportEpoch> epochs;
  std::string epochs_source;
  // step_times.csv: column name -> values ("step", "step_seconds", "data_wait_seconds", ...).
  std::map<std::string, std::vector<double>> step_times;
  int64_t images_per_step = 0;  // global batch (batch x grad_accum x world size); 0 when unknown
  std::vector<std::pair<std::string, std::string>> summary;  // summary.json, in file order, as text
  std::vector<std::pair<std::string, std::string>> config;   // the config.toml keys runs differ in most
  std::vector<std::string> notes;                            // files missing, fallbacks taken
};

// Reads dir. Throws std::runtime_error naming the directory and what is missing when it is not a run
// directory (no train_steps.csv, metrics.csv, train.log or summary.json).
ReportRun read_report_run(const std::filesystem::path& dir);

// A CSV with a header line and numeric fields: column -> values (empty or unparsable fields read as
// NaN). A last line without its newline (a run still writing it) is left out. Empty when the file
// cannot be read.
std::map<std::string, std::vector<double>> read_numeric_csv(const std::filesystem::path& path);

// train.log's epoch lines, "epoch 2/4: train loss 0.5123, 31.0s, 1934 img/s | test loss 0.41 top1
// 85.10% top5 99.60%" (the test part only when evaluated).
std::vector<ReportEpoch> parse_epoch_lines(const std::string& log_text);

}  // namespace trainer
