#pragma once
// Which plan a convolution runs, decided once per (op, shapes, params, dtype, layout, TF32 setting,
// pointer alignment, deterministic mode) by timing candidates on the call's own buffers, and cached
// for the process's life. The graph API's fastest candidate (nn/cuda/conv_graph_api.h) is compared
// with the legacy API's (nn/cuda/conv_legacy_api.h), both timed as calls queued back to back
// (nn/cuda/conv_timing.h); the legacy one wins only when more than 5% faster, or within 5% with a
// smaller workspace.
// Deterministic mode compares no timings. TRAINER_CUDNN_API=legacy|graph (nn/cuda/cudnn_switches.h)
// uses one API only.
#include "nn/cuda/conv_plan.h"

namespace trainer::cudnn_conv {

// The cached plan for the convolution of op on ptrs = {x or dx, w or dw, y or dy}, built (and timed
// on these buffers) on first use. The reference stays valid for the process's life.
const Plan& plan_for(ConvOp op, DType dtype, bool nhwc, const Shape& xs, const Shape& wsh, const Shape& ys,
                     const Conv2dParams& p, void* const ptrs[3]);

}  // namespace trainer::cudnn_conv
