#pragma once
// train.cudnn_fusion: BatchNorm's batch statistics computed in the preceding convolution's epilogue
// (cuDNN runtime fusion), so that the BatchNorm does not read the convolution's output once more
// just to sum it per channel: a small gain in img/s on resnet18-cifar bf16, larger at small batches,
// where that extra pass weighs more (figures: bench/PERF_NOTES.md, v8).
//
// How: when a forward convolution runs under a ConvFeedsBatchNormStats hint (nn/fusion_hints.h,
// set by Conv2d for convolutions that feed a BatchNorm, in training), CudaBackend::conv2d asks
// conv2d_with_channel_sums() first. For bf16/f16 channels-last inputs without bias it runs a cuDNN
// graph "convolution -> sum over N, H, W of y and of y * y" and keeps the two f32 sums with y; the
// BatchNorm's CudaBackend::bn_train_stats(y) then takes them (take_channel_sums) and finishes the
// mean, inverse std and running statistics in one small kernel instead of its reduction over y.
// Autograd is unchanged: y is an ordinary convolution output.
//
// Where it pays: per convolution shape, the first call (an eager step, never inside a CUDA graph
// capture) compiles the fused engines cuDNN offers (their kernels are compiled at run time, a
// start-up cost per shape; figures: bench/PERF_NOTES.md, "Figures moved out of headers (session 14)"),
// times the best against the convolution followed by our statistics kernel, and fuses
// from then on only if it is at least 3% faster. Numbers: the fused statistics are sums of y and y^2
// (mean and E[y^2] - mean^2 in double from f32 sums) where ours are shifted by each channel's first
// value, so results differ in the last bits, and a channel whose |mean| is far above its spread loses
// precision in its variance. Off under train.deterministic (the fused reductions' order may vary) and
// when the BatchNorm is a SyncBatchNorm (it computes its statistics itself).
#include <cstdint>
#include <functional>
#include <optional>
#include <utility>

#include "nn/backend.h"
#include "nn/tensor.h"

namespace trainer::cuda {

enum class ConvStatsFusion {
  off,           // the default
  where_faster,  // train.cudnn_fusion: fuse the shapes where the fused engine timed >= 3% faster
  always,        // wherever a fused engine runs (tests: force_conv_stats_fusion)
};
// From the backend's options (runtime::BackendOptions::conv_stats_fusion and its force_).
ConvStatsFusion conv_stats_fusion();

// For every forward convolution (CudaBackend::conv2d): drops the sums kept by the previous one, then,
// where fusion applies, runs y = conv(x, w) with y's per-channel sums, keeps them for
// take_channel_sums(y) and returns y. nullopt: the caller runs the convolution itself. `plain` runs
// the convolution the usual way (timed against the fused engine at a shape's first call).
std::optional<Tensor> conv2d_with_channel_sums(const Tensor& x, const Tensor& w, bool has_bias,
                                               const Conv2dParams& p, const Shape& ys,
                                               const std::function<Tensor()>& plain);

struct ChannelSums {
  Tensor sum, sqsum;  // f32 [C]: sum of y and of y * y over N, H, W
  int64_t count = 0;  // values per channel, N * H * W
};
// The sums kept for exactly this tensor (same storage, shape and strides) by the last fused
// convolution, handed out once; nullopt otherwise.
std::optional<ChannelSums> take_channel_sums(const Tensor& y);

// bn_train_stats from sums (nn/cuda/batch_norm.cu): the mean and inverse std in x_dtype's statistics
// dtype, and the running statistics moved towards the batch's (unbiased variance), like
// CudaBackend::bn_train_stats.
std::pair<Tensor, Tensor> bn_train_stats_from_sums(const ChannelSums& sums, DType x_dtype, double eps,
                                                   double momentum, Tensor& running_mean,
                                                   Tensor& running_var);

// Convolutions run fused and BatchNorms that used their sums, since the process started (tests, logs).
int64_t fused_convolutions();
int64_t batch_norms_from_sums();

}  // namespace trainer::cuda
