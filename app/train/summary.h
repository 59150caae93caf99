#pragma once
// The JSON written by --summary at the end of a run, for scripts and benchmarks.
#include <cstdint>
#include <string>

#include "metrics/output_file.h"

namespace trainer {

struct RunSummary {
  int epochs = 0;
  int64_t steps = 0;
  int world_size = 1;
  double train_seconds = 0.0;  // training steps only, without evaluation
  double samples_per_second = 0.0;
  double final_test_accuracy = 0.0;
  double best_test_accuracy = 0.0;
  double final_test_top5 = 0.0;
  double final_test_loss = 0.0;
  int64_t final_test_skipped = 0;  // unreadable test images left out (data.bad_samples = "skip")
  double final_train_loss = 0.0;
  // The weight average's (ema.enabled; written only then): its last and best test top-1, its last loss.
  bool has_ema = false;
  double final_ema_test_accuracy = 0.0;
  double best_ema_test_accuracy = 0.0;
  double final_ema_test_loss = 0.0;
  std::string run_dir;
  std::string weights;
};

std::string summary_json(const RunSummary& s);
// Checked and fsynced: a failed write (a full disk) throws OutputFileError naming the file. Writes go
// where `full_disk` says (a test hook, metrics/output_file.h).
void write_summary(const std::string& path, const RunSummary& s, const FullDiskHook& full_disk = {});

}  // namespace trainer
