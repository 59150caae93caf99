#pragma once
// A convolution through cuDNN's legacy API: cudnnFind*AlgorithmEx times the algorithms on the call's
// buffers, including the FFT and Winograd ones that the graph API's heuristics leave out (the fastest
// in strict f32). The plan keeps the descriptors and the chosen algorithm.
#include <memory>

#include "nn/cuda/conv_plan.h"

namespace trainer::cudnn_conv {

// The legacy algorithm Find times fastest on ptrs = {x or dx, w or dw, y or dy} (by the rule of
// nn/cuda/conv_timing.h; in deterministic mode the lowest-numbered deterministic one), under the
// workspace limit; plan->none when the layout has none. time_ms: Find's time for it.
std::unique_ptr<Plan> legacy_plan(ConvOp op, DType dtype, bool nhwc, const Shape& xs, const Shape& wsh,
                                  const Shape& ys, const Conv2dParams& p, void* const ptrs[3],
                                  float& time_ms);

// Runs the legacy algorithm of plan on ptrs = {x or dx, w or dw, y or dy} with workspace wp.
void execute_legacy(const Plan& plan, ConvOp op, DType dtype, void* const ptrs[3], void* wp);

}  // namespace trainer::cudnn_conv
