#pragma once
// How many loader threads a rank starts when data.workers = -1.
#include <string>

#include "app/config/config.h"

namespace trainer {

// Cores are shared by the ranks of this node (local_world_size); each rank gets its share of them.
// On a GPU rank the math runs on the GPU, so the loader takes that share less one core for the
// training thread (which launches kernels and waits for batches); on a CPU rank the math library
// needs the other half. At least one either way.
int default_loader_workers(bool gpu_rank, int local_world_size, unsigned cores);

// The same for this process: a GPU rank when train.device is "cuda", or "auto" with a visible GPU;
// the node's local_world_size ranks (ProcessEnv::local_world_size, read at start-up) and the cores
// this process may use.
int default_loader_workers(const Config& config, int local_world_size);

// One log line: how many loader threads this rank starts and why ("data.workers = -1: 15 loader
// threads per rank (16 cores / 1 rank on this node, less 1 for the training thread of a GPU rank)").
std::string loader_workers_reason(const Config& config, int local_world_size);

}  // namespace trainer
