#pragma once
// `trainer train`: the training loop, from setup through the epochs to the summary. One optimizer
// step (data, forward, backward, all-reduce, optimizer) is train_step() in app/train_step.h.
#include <string>

#include "app/config.h"

namespace trainer {

struct TrainOptions {
  std::string summary_path;  // --summary: JSON written at the end; empty = none
  std::string resume;        // --resume: "" (fresh run), "auto" (newest good checkpoint, if any) or a path
};

// Trains as `config` says; returns the process exit code (0, or 128 + signal after a checkpoint on
// SIGINT/SIGTERM). Throws ConfigError / DataError / CheckpointError / std::runtime_error with a
// message for the user on anything that stops the run.
int run_training(const Config& config, const TrainOptions& options);

// Loader threads per rank when data.workers = -1.
int default_loader_workers();

// A warning when `workers` loader threads (data.workers) on each of a node's `local_world_size` ranks
// start more threads than the node has `cores` (the seed guides' pitfall: "the total worker count
// balloons and exhausts the CPU's memory"); "" when they fit, and for workers < 0 (the default shares
// the cores between the node's ranks).
std::string loader_workers_warning(int workers, int local_world_size, unsigned cores);

// NCCL reads its settings from the environment when the communicator is created: dist.nccl_debug and
// dist.socket_ifname become NCCL_DEBUG and NCCL_SOCKET_IFNAME for this process (the seed guides'
// "NCCL picks the wrong interface" and "turn on NCCL's logs"), so users need not export them on every
// node by hand. Empty keys leave the environment as it is.
void export_nccl_settings(const Config& config);

// A note when several ranks (or accumulated micro-batches) train with optim.lr as given
// (optim.lr_scaling = "none") on a global batch larger than data.batch_size: the seed guides' rule
// scales the learning rate with the global batch, and a user moving from one GPU may have forgotten.
// "" with one rank and no accumulation, or with optim.lr_scaling = "linear".
std::string lr_scaling_note(const Config& config, int world_size);

}  // namespace trainer
