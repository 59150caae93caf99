#pragma once
// `trainer bench-data`: the input pipeline alone, no model. (a) JPEG decode + RandomResizedCrop
// images/s per core, (b) CIFAR-shaped batches/s with crop + flip, both through the real DataLoader at
// 1 worker and at N, on generated data unless a dataset is given. Results: a table on stdout,
// loader_bench.csv and loader_bench.json in the output directory.
#include <string>
#include <vector>

namespace trainer {

int bench_data_command(const std::vector<std::string>& args);

}  // namespace trainer
