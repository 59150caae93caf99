#pragma once
// Which runs can record their training step as a CUDA graph, and where fp16's loss scaler must keep
// its state: decisions that follow from the config alone. The device setup reads them to build the
// precision policy (app/run/device_setup.cpp) before any step exists; the step graph itself is
// app/train/step_graph.h.
#include <string>

#include "app/config/config.h"

namespace trainer {

// Why this run's step cannot be captured ("" when it can): the first feature of the config that needs
// the host inside a step. `world_size` is the number of ranks.
std::string step_graph_blocker(const Config& config, int world_size);

// Why fp16's loss scaler must decide on the host whether a step is skipped ("" when it can keep its
// state and decision on the device, LossScaler::keep_on_device): the sharded optimizer (it unscales its
// own shard). SGD and AdamW both skip on the device flag exactly (Optimizer::skips_exactly_on_device);
// gradient clipping stays on the device too (clip_grad_norm_on_device).
std::string loss_scaler_host_reason(const Config& config);

}  // namespace trainer
