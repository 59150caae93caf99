#pragma once
// The per-step and per-epoch CSV files of a run directory, read by people, pandas and `trainer report`.
//
// train_steps.csv (rank 0, one row per optimizer step):
//   step       optimizer step, 1-based, counted over the whole run (a resumed run continues the count)
//   epoch      1-based epoch of the step
//   loss       rank 0's training loss of the step
//   lr         learning rate of the step
//   wall_time  when the step's loss was known on the host, Unix seconds (UTC), millisecond resolution
//
// metrics.csv (rank 0, one row per completed epoch):
//   wall_time          end of the epoch (after its evaluation), Unix seconds (UTC)
//   epoch              1-based epoch
//   step               optimizer steps taken by the end of the epoch
//   train_loss         the epoch's mean training loss over every rank's steps
//   eval_loss          mean test loss                                  } empty when the epoch was
//   eval_top1          test top-1 accuracy, ratio in [0, 1]            } not evaluated
//   eval_top5          test top-5 accuracy, ratio in [0, 1]            }
//   eval_auc           test ROC AUC (binary tasks); empty when not defined or not evaluated
//   lr                 learning rate of the epoch's last step
//   images_per_second  training samples per second over all ranks during the epoch
//   loss_scale         the fp16 loss scale at the epoch's end (1 for other precisions)
// Empty cells read as NaN in pandas (pd.read_csv), so the columns stay numeric.
//
// A resumed run appends to both, after cutting away the rows past the checkpoint's step (steps a
// crashed run logged after its last checkpoint are run again), as train_steps.csv always did.
#include <cstdint>
#include <optional>
#include <string>

#include "metrics/output_file.h"

namespace trainer {

// Now, as Unix seconds with millisecond resolution (system clock: comparable across hosts and runs).
double unix_seconds_now();

// train_steps.csv.
std::string train_steps_header();  // "step,epoch,loss,lr,wall_time"
std::string train_steps_row(int64_t step, int epoch, double loss, double lr, double wall_time);

// One row of metrics.csv; nullopt cells are written empty.
struct EpochMetrics {
  double wall_time = 0.0;
  int epoch = 0;  // 1-based
  int64_t step = 0;
  double train_loss = 0.0;
  std::optional<double> eval_loss, eval_top1, eval_top5, eval_auc;
  double lr = 0.0;
  double images_per_second = 0.0;
  double loss_scale = 1.0;
  std::optional<double> ema_eval_loss, ema_eval_top1, ema_eval_top5;  // the weight average's (ema.enabled)
};

std::string epoch_metrics_header();
std::string epoch_metrics_row(const EpochMetrics& m);

// Rewrites the CSV at `path` as `header` and the rows whose column `step_column` (0-based) is an
// integer <= last_step and which have the header's number of columns; rows of another layout (an older
// trainer's file) are dropped rather than left under a header they do not match.
void keep_csv_rows_up_to_step(const std::string& path, const std::string& header, int step_column,
                              int64_t last_step, const FullDiskHook& full_disk);

// The test metrics of an evaluation, as metrics.csv records them.
struct EvalCells {
  double loss = 0.0;
  double top1 = 0.0;
  double top5 = 0.0;
  double auc = 0.0;                                    // NaN when not defined: written empty
  std::optional<double> ema_loss, ema_top1, ema_top5;  // the weight average's evaluation, when there is one
};

// Rank 0's metrics.csv. open() keeps the rows up to `first_step` (the checkpoint's step when resuming;
// 0 on a fresh start, which leaves the header alone) and appends after them. set_eval() holds an
// evaluation's results for the epoch's row; write_epoch() writes that row (eval cells empty when the
// epoch was not evaluated) and hands it to the kernel at once.
class EpochMetricsCsv {
 public:
  void open(const std::string& run_dir, int64_t first_step, const FullDiskHook& full_disk);
  bool is_open() const { return file_.is_open(); }
  void set_eval(const EvalCells& eval) { eval_ = eval; }
  // No-op when not open (ranks other than 0), except that the held evaluation is used up.
  void write_epoch(int epoch, int64_t step, double train_loss, double lr, double images_per_second,
                   double loss_scale);
  void write(const EpochMetrics& m);
  void close() { file_.close(); }

 private:
  OutputFile file_;
  std::optional<EvalCells> eval_;
};

}  // namespace trainer
