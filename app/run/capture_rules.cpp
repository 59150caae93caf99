#include "app/run/capture_rules.h"

#include "app/common/format.h"

namespace trainer {

std::string step_graph_blocker(const Config& config, int world_size) {
  if (!config.train.cuda_graph) return "train.cuda_graph = false";
  if (world_size > 1 && !config.dist.cuda_graph)
    return fmt(
        "%d ranks and dist.cuda_graph = false: set it to capture the all-reduce too, at the cost of "
        "per-phase step times",
        world_size);
  if (world_size > 1 && config.dist.backend == CommBackendChoice::tcp)
    return "dist.backend = \"tcp\": collectives through the host cannot be captured";
  if (config.train.precision == Precision::fp16 && !loss_scaler_host_reason(config).empty())
    return "train.precision = \"fp16\" with " + loss_scaler_host_reason(config) +
           ": the loss scaler decides on the host whether a step is skipped";
  if (config.train.grad_accum_steps > 1) return "train.grad_accum_steps > 1: micro-batches are not captured";
  if (config.model.dropout > 0) return "model.dropout: its random masks are drawn with a host-side generator";
  if (config.dist.zero_stage > 0) return "dist.zero_stage: the sharded optimizer is not captured";
  return "";
}

std::string loss_scaler_host_reason(const Config& config) {
  if (config.dist.zero_stage > 0) return "dist.zero_stage";
  return "";
}

}  // namespace trainer
