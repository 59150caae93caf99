#pragma once
// Does the trainer's convolution search miss a faster kernel on this GPU and cuDNN? (bench/PERF_NOTES.md
// v11.) The trainer times the first 10 usable configurations of cuDNN's heuristics, mode A
// (nn/cuda/conv_graph_api.h). The wide search also times the rest of mode A's list, mode B's list
// and the knob neighbours (bench/cudnn/cudnn_knobs.h) of the first four configurations, each
// configuration once, up to 160 per convolution. For one convolution shape and dtype (channels-last),
// forward and both backwards, this probe runs both searches as training does (same numerics filter,
// workspace cap, queued timing and selection rule) and prints each one's pick. On an H200 with cuDNN
// 9.19 the wide search found nothing faster (v11), so training runs only the first.
#include <vector>

#include "bench/cudnn/conv_probe_row.h"
#include "nn/backend.h"
#include "nn/tensor.h"

namespace trainer::bench {

// x [N, C, H, W] and w [K, C, R, S] in `dtype` (f32, f16 or bf16), channels-last.
std::vector<ConvProbeRow> probe_knob_search(DType dtype, const Shape& x, const Shape& w,
                                            const Conv2dParams& p);

}  // namespace trainer::bench
