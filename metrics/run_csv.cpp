#include "metrics/run_csv.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

namespace trainer {
namespace {

std::string g9(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string seconds3(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

std::string cell(const std::optional<double>& v) { return v ? g9(*v) : ""; }

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> fields;
  std::istringstream in(line);
  for (std::string f; std::getline(in, f, ',');) fields.push_back(f);
  if (!line.empty() && line.back() == ',') fields.emplace_back();  // an empty last cell
  return fields;
}

bool is_integer(const std::string& s) {
  if (s.empty()) return false;
  char* end = nullptr;
  std::strtoll(s.c_str(), &end, 10);
  return *end == '\0';
}

}  // namespace

double unix_seconds_now() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count() / 1000.0;
}

std::string train_steps_header() { return "step,epoch,loss,lr,wall_time"; }

std::string train_steps_row(int64_t step, int epoch, double loss, double lr, double wall_time) {
  return std::to_string(step) + ',' + std::to_string(epoch) + ',' + g9(loss) + ',' + g9(lr) + ',' +
         seconds3(wall_time);
}

std::string epoch_metrics_header() {
  return "wall_time,epoch,step,train_loss,eval_loss,eval_top1,eval_top5,eval_auc,lr,images_per_second,"
         "loss_scale,ema_eval_loss,ema_eval_top1,ema_eval_top5";
}

std::string epoch_metrics_row(const EpochMetrics& m) {
  return seconds3(m.wall_time) + ',' + std::to_string(m.epoch) + ',' + std::to_string(m.step) + ',' +
         g9(m.train_loss) + ',' + cell(m.eval_loss) + ',' + cell(m.eval_top1) + ',' + cell(m.eval_top5) +
         ',' + cell(m.eval_auc) + ',' + g9(m.lr) + ',' + g9(m.images_per_second) + ',' + g9(m.loss_scale) +
         ',' + cell(m.ema_eval_loss) + ',' + cell(m.ema_eval_top1) + ',' + cell(m.ema_eval_top5);
}

void keep_csv_rows_up_to_step(const std::string& path, const std::string& header, int step_column,
                              int64_t last_step, const FullDiskHook& full_disk) {
  const std::size_t columns = split_csv(header).size();
  std::string kept = header + "\n";
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const std::vector<std::string> f = split_csv(line);
    if (f.size() == columns && is_integer(f[step_column]) && std::atoll(f[step_column].c_str()) <= last_step)
      kept += line + "\n";
  }
  in.close();
  write_whole_file(path, kept, full_disk);
}

void EpochMetricsCsv::open(const std::string& run_dir, int64_t first_step, const FullDiskHook& full_disk) {
  const std::string path = run_dir + "/metrics.csv";
  keep_csv_rows_up_to_step(path, epoch_metrics_header(), 2, first_step, full_disk);
  file_.open(path, OutputFile::Mode::append, full_disk);
}

void EpochMetricsCsv::write_epoch(int epoch, int64_t step, double train_loss, double lr,
                                  double images_per_second, double loss_scale) {
  EpochMetrics m;
  m.wall_time = unix_seconds_now();
  m.epoch = epoch;
  m.step = step;
  m.train_loss = train_loss;
  if (eval_) {
    m.eval_loss = eval_->loss;
    m.eval_top1 = eval_->top1;
    m.eval_top5 = eval_->top5;
    if (!std::isnan(eval_->auc)) m.eval_auc = eval_->auc;
    m.ema_eval_loss = eval_->ema_loss;
    m.ema_eval_top1 = eval_->ema_top1;
    m.ema_eval_top5 = eval_->ema_top5;
  }
  m.lr = lr;
  m.images_per_second = images_per_second;
  m.loss_scale = loss_scale;
  eval_.reset();
  write(m);
}

void EpochMetricsCsv::write(const EpochMetrics& m) {
  if (!file_.is_open()) return;
  file_.write(epoch_metrics_row(m) + '\n');
  file_.flush();
}

}  // namespace trainer
