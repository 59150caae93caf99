#pragma once
// How the per-channel ops (batch norm and its fused forms, on both backends) walk an [N, C, ...]
// tensor: as `outer` runs of `channels` x `inner` elements, contiguous NC... (inner = prod of the dims
// after C) or channels-last (outer = N*H*W, inner = 1).
#include <cstdint>

#include "nn/tensor.h"

namespace trainer {

struct ChannelLayout {
  MemoryFormat format = MemoryFormat::contiguous;
  int64_t outer = 0;     // N, or N*H*W for channels-last
  int64_t channels = 0;  // C
  int64_t inner = 1;     // prod(dims after C), or 1 for channels-last
  int64_t per_channel() const { return outer * inner; }
};

// The layout `x` is in (its suggested memory format); throws std::invalid_argument naming `op` when x
// has no channel dimension.
ChannelLayout channel_layout(const Tensor& x, const char* op);

}  // namespace trainer
