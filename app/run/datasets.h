#pragma once
// Builds the train and test datasets a config asks for. Data errors about the location are reported
// against the config key that set it (file:line:column: data.root: ...).
#include <memory>
#include <string>

#include "app/config/config.h"
#include "data/dataset.h"
#include "data/file_cache.h"
#include "data/host_limits.h"

namespace trainer {

struct Datasets {
  std::shared_ptr<const Dataset> train;
  std::shared_ptr<const Dataset> test;
};

// Opens the datasets and checks them against this host (check_data_fits_host), shared by the node's
// local_world_size ranks (ProcessEnv::local_world_size, read at start-up).
Datasets open_datasets(const Config& config, int local_world_size);
// Throws a ConfigError naming the key when the run's data sizes cannot fit `host`, before anything is
// allocated: the sampler's index lists for the datasets' sizes (data.synthetic_samples, or data.root's
// dataset) within half the available memory, a training batch no larger than the training set unless
// data.drop_last would drop it anyway (data.batch_size), the loader's batches in flight
// (data.batch_size, data.eval_batch_size, data.prefetch_batches) within half the available memory, and
// data.workers within max_loader_workers(). The node's local_world_size ranks share the memory.
void check_data_fits_host(const Config& config, const Datasets& data, const HostLimits& host,
                          int local_world_size);
// One log line on data.cache: how much of each split is cached, of what budget, shared or per rank;
// "" when data.cache = "none" or the dataset is not an image folder.
std::string data_cache_report(const Datasets& data);
// The data.cache of a split, for the exporter's trainer_data_cache_* gauges; null without one.
const FileCache* data_cache_of(const Dataset* dataset);
// The per-channel statistics the config asks for, else the dataset's own.
Normalization resolved_normalization(const Config& config, const Dataset& dataset);

}  // namespace trainer
