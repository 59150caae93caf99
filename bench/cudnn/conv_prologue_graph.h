#pragma once
// A BatchNorm's normalisation and ReLU as a convolution's prologue, as a cuDNN graph: what
// bench/cudnn/conv_prologue_probe.h measures. Built from the pieces of the fused statistics' graphs
// (nn/cuda/conv_stats_graph.h); tensors are channels-last in bf16 or f16.
#include <cudnn.h>

#include <cstdint>
#include <vector>

#include "nn/cuda/conv_stats_graph.h"

namespace trainer::bench {

// Tensor ids of the prologue's variant pack beyond conv_stats' (kAfter*: virtual intermediates).
constexpr int64_t kScale = cuda::conv_stats::kFirstFreeUid, kBias = kScale + 1, kAfterScale = kScale + 2,
                  kAfterBias = kScale + 3, kAfterRelu = kScale + 4;

// y = conv(relu(x * scale + bias), w) with per-channel scale and bias [1, C, 1, 1] in `coefficients`
// (f32, or the data type), applied as the convolution loads x (the ConvBNfprop pattern; with_genstats
// adds its statistics epilogue). Empty when cuDNN refuses the graph.
cuda::conv_stats::OpGraph build_prologue(cudnnHandle_t handle, DType dtype, cudnnDataType_t coefficients,
                                         const Shape& xs, const Shape& ws, const Shape& ys,
                                         const Conv2dParams& p, bool with_genstats);
// Its variant pack's uids: x, scale, bias, w, y (+ sum, sqsum).
std::vector<int64_t> prologue_pack_uids(bool with_genstats);

}  // namespace trainer::bench
