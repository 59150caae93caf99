#pragma once
// Without SyncBatchNorm every rank's BatchNorm running statistics follow its own shard of the data, so
// ranks evaluate and checkpoint slightly different models. Averaging them before evaluation and
// before a checkpoint (model.bn_stats_sync = "average") makes every rank hold the same statistics
// and the checkpoint describe all the data, not only rank 0's.
#include "dist/comm.h"
#include "nn/modules/module.h"

namespace trainer {

// All-reduce-averages running_mean and running_var of every BatchNorm2d in `model` (in place,
// bitwise identical on every rank afterwards); num_batches_tracked is left as it is (every rank
// counted the same steps). One collective per dtype, not per layer; nothing at world size 1.
// Every rank must call it at the same point. Returns the number of BatchNorm2d layers.
int average_bn_running_stats(Module& model, Comm& comm);

}  // namespace trainer
