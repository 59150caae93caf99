#include "app/train/summary.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace trainer {

std::string summary_json(const RunSummary& s) {
  // In this order, for people reading it; numbers in full (shortest round-trip form), NaN as null.
  nlohmann::ordered_json j;
  j["epochs"] = s.epochs;
  j["steps"] = s.steps;
  j["world_size"] = s.world_size;
  j["train_seconds"] = s.train_seconds;
  j["samples_per_second"] = s.samples_per_second;
  j["final_test_accuracy"] = s.final_test_accuracy;
  j["best_test_accuracy"] = s.best_test_accuracy;
  j["final_test_top5"] = s.final_test_top5;
  j["final_test_loss"] = s.final_test_loss;
  j["final_test_skipped_samples"] = s.final_test_skipped;
  j["final_train_loss"] = s.final_train_loss;
  if (s.has_ema) {
    j["final_ema_test_accuracy"] = s.final_ema_test_accuracy;
    j["best_ema_test_accuracy"] = s.best_ema_test_accuracy;
    j["final_ema_test_loss"] = s.final_ema_test_loss;
  }
  j["run_dir"] = s.run_dir;
  j["weights"] = s.weights;
  // A path that is not UTF-8 must not lose the summary: such bytes become U+FFFD.
  return j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

void write_summary(const std::string& path, const RunSummary& s, const FullDiskHook& full_disk) {
  write_whole_file(path, summary_json(s), full_disk);
}

}  // namespace trainer
