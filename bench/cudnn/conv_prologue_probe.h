#pragma once
// Does cuDNN pay for BatchNorm's normalisation + ReLU as the next convolution's prologue? (issue 12,
// bench/PERF_NOTES.md "What is left"). Today a BatchNorm writes y = relu(x * scale + bias) and the
// convolution reads it back; cuDNN's runtime fusion can apply scale, bias and ReLU as the convolution
// loads x instead (the ConvBNfprop pattern), which saves the write and the read of y. For one
// convolution shape and dtype (NHWC) this probe times:
//   - the convolution alone (its best graph-API engine);
//   - ours: bn_apply (scale, bias, ReLU), then the convolution;
//   - the fused prologue, with f32 and with half per-channel coefficients, and with the statistics
//     epilogue as well (against ours: bn_apply, the convolution, bn_mean_var);
// each the mean of 50 calls queued back to back, best of three rounds, and compares the fused output
// with ours. Forward only: a training step would also need y (or its recomputation) for the weight
// gradient and the ReLU's mask. A measurement, not used by training (bench/cudnn_prologue_probe).
#include <vector>

#include "bench/cudnn/conv_stats_fusion_probe.h"

namespace trainer::bench {

// x [N, C, H, W] (the BatchNorm's input) and w [K, C, R, S] in `dtype` (bf16 or f16), channels-last.
std::vector<ConvProbeRow> probe_conv_prologue_fusion(DType dtype, const Shape& x, const Shape& w,
                                                     const Conv2dParams& p);

}  // namespace trainer::bench
