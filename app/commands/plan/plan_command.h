#pragma once
// `trainer plan`: how much memory a config needs per rank under plain data parallelism and the three
// ZeRO stages, from the parameter count, the bytes per parameter the precision and optimizer imply, the
// weight average's copy (ema.enabled), and activation memory measured by one dry-run forward + backward
// step; recommends the simplest strategy that fits a given device memory.
#include <cstdint>
#include <string>
#include <vector>

#include "app/config/settings.h"

namespace trainer {

// Bytes of model state per parameter.
struct BytesPerParam {
  int weights = 4, gradients = 4, master = 0, optimizer = 0;
};
// Every precision keeps f32 weights and gradients (autocast); optimizer state: sgd (momentum > 0: one
// buffer) | adamw (two).
BytesPerParam bytes_per_param(OptimizerKind optimizer, double momentum);

enum class Strategy { dp, zero1, zero2, zero3 };
struct StrategyMemory {
  Strategy strategy = Strategy::dp;
  std::string name;                                                               // "DP", "ZeRO-1", ...
  double weights = 0, gradients = 0, master = 0, optimizer = 0, activations = 0;  // bytes per rank
  double ema = 0;  // ema.enabled: the weight average, whole on every rank (ZeRO does not shard it)
  double total() const { return weights + gradients + master + optimizer + activations + ema; }
};
// Per-rank memory of each strategy at `ranks` ranks: ZeRO-1 shards optimizer state and master weights,
// ZeRO-2 also gradients, ZeRO-3 also weights, each to ceil(params / ranks) elements (the flat parameter
// vector is padded to a multiple of the ranks, as dist/zero_optimizer.h does); activations are never
// sharded. With `buckets` (elements per gradient bucket, plan_gradient_buckets) ZeRO-2 is what
// dist/zero_optimizer.h does: each bucket is padded to a multiple of the ranks, so a shard holds the sum
// of ceil(bucket / ranks); its gradients add the reduction buffer (the largest padded bucket) and the
// full gradients of the bucket backward is filling (the largest bucket). `ema_bytes` (the weight
// average's copy, ModelEma::bytes) is added to every strategy unsharded.
std::vector<StrategyMemory> strategy_memory(int64_t params, const BytesPerParam& b, int64_t activation_bytes,
                                            int ranks, const std::vector<int64_t>& buckets = {},
                                            int64_t ema_bytes = 0);

int plan_command(const std::vector<std::string>& args);

}  // namespace trainer
