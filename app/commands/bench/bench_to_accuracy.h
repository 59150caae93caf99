#pragma once
// `trainer bench --to-accuracy X`: time to accuracy instead of throughput. Every point (processes x
// precision x per-rank batch x repeat) trains CONFIG with train.target_accuracy = X and an evaluation
// after every epoch, so the run stops after the first epoch whose test top-1 reaches X, or after
// train.epochs without reaching it. The time to accuracy is the run's training seconds (summary.json's
// train_seconds: steps only, evaluation and start-up excluded, as they do not shrink with more
// processes); the wall-clock seconds of the whole run are reported beside it. Speedup = time to
// accuracy of the fewest processes / this point's, for points that reached X.
#include <filesystem>
#include <string>
#include <vector>

#include "app/commands/bench/bench_runs.h"
#include "app/config/config.h"

namespace trainer {

int bench_to_accuracy(const bench::BenchArgs& a, const Config& config,
                      const std::vector<std::string>& precisions, const std::vector<int>& batches,
                      const std::filesystem::path& out);

}  // namespace trainer
