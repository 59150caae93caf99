#pragma once
// The model's input made on the GPU: uint8 batches travel to the device at a quarter of the bytes of
// float ones, and the conversion costs the GPU microseconds instead of the host a pass over the batch.
// Plain C++ (no CUDA headers), so that data/ can include it in CUDA builds.
#include <vector>

#include "nn/tensor.h"

namespace trainer::cuda {

// Most channels the kernel takes statistics for (RGBA).
constexpr int kMaxNormalizeChannels = 4;

// u8 [B, H, W, C] contiguous on this process's GPU -> f32 [B, C, H, W] on the GPU laid out in
// `format`, (x / 255 - mean[c]) / std[c], queued on the compute stream. The same correctly rounded
// float32 operations as data/normalize.cpp's to_float_normalized, so the result is bit-identical to
// the CPU's. mean and std hold C values or one for every channel. Throws std::invalid_argument on a
// wrong dtype, rank, device or layout, statistics of the wrong size, a std that is not positive, or
// more than kMaxNormalizeChannels channels.
Tensor normalize_u8_nhwc(const Tensor& u8_nhwc, const std::vector<float>& mean, const std::vector<float>& std,
                         MemoryFormat format = MemoryFormat::contiguous);

}  // namespace trainer::cuda
