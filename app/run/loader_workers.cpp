#include "app/run/loader_workers.h"

#include <algorithm>
#include <thread>

#include "nn/runtime.h"

namespace trainer {

namespace {

unsigned node_cores() { return std::max(1u, std::thread::hardware_concurrency()); }

// Whether setup_device() puts this rank on a GPU (without initialising the backend).
bool trains_on_gpu(const Config& config) {
  if (config.train.device == DeviceChoice::cuda) return true;
  if (config.train.device == DeviceChoice::automatic) return runtime::device_count() > 0;
  return false;
}

}  // namespace

int default_loader_workers(bool gpu_rank, int local_world_size, unsigned cores) {
  const int share =
      static_cast<int>(std::max(1u, cores) / static_cast<unsigned>(std::max(1, local_world_size)));
  return std::max(1, gpu_rank ? share - 1 : share / 2);
}

int default_loader_workers(const Config& config, int local_world_size) {
  return default_loader_workers(trains_on_gpu(config), std::max(1, local_world_size), node_cores());
}

std::string loader_workers_reason(const Config& config, int local_world_size) {
  const int ranks = std::max(1, local_world_size);
  const unsigned cores = node_cores();
  const std::string share = std::to_string(cores) + " cores / " + std::to_string(ranks) +
                            (ranks == 1 ? " rank" : " ranks") + " on this node";
  if (config.data.workers >= 0) {
    return "data loader: " + std::to_string(config.data.workers) +
           " worker threads per rank (data.workers; " + share + ")";
  }
  const bool gpu = trains_on_gpu(config);
  const int workers = default_loader_workers(gpu, ranks, cores);
  return "data loader: " + std::to_string(workers) + " worker threads per rank (data.workers = -1: " + share +
         (gpu ? ", less 1 for the training thread of a GPU rank)" : ", halved for the CPU math library)");
}

}  // namespace trainer
