#pragma once
// Does cuDNN fusion pay for BatchNorm's forward statistics? (issue 12, "cuDNN runtime fusion where it
// pays"). BatchNorm reads every convolution output once more only to sum it per channel; cuDNN can
// compute the per-channel sum and sum of squares in the convolution's epilogue instead. This probe
// builds, for one convolution shape and dtype (NHWC), the fused graphs that would do it, asks cuDNN's
// heuristics for engines, finalises and times every one that runs, and times the way we run today:
// the convolution (its best graph-API engine) followed by our statistics kernel (Backend::bn_mean_var).
// Each figure is the mean of 50 calls queued back to back (best of three rounds), so launch latency
// hides behind the previous call as it does in a training step. The fused statistics are compared
// with ours on the same output. A measurement for bench/PERF_NOTES.md (bench/cudnn_fusion_probe), not
// used by training.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bench/cudnn/conv_probe_row.h"
#include "nn/backend.h"
#include "nn/cuda/conv_stats_graph.h"
#include "nn/tensor.h"

namespace trainer::bench {

// A finalised plan with the workspace and pointers to run it on.
struct RunnablePlan {
  cuda::conv_stats::Plan plan;
  std::vector<int64_t> uids;
  std::vector<void*> ptrs;
  Tensor workspace;
  bool execute() const { return plan.execute(uids, ptrs, workspace.raw_data()); }
};

// Every engine the heuristics offer for graph g (each engine once, though both heuristics modes may
// list it), finalised and timed on `buffers` (by uid, in `uids` order). `best` receives the fastest.
// Shared with the prologue probe (bench/cudnn/conv_prologue_probe.h).
ConvProbeRow probe_engines(const cuda::conv_stats::OpGraph& g, const char* name,
                           const std::vector<int64_t>& uids, const std::map<int64_t, void*>& buffers,
                           std::optional<RunnablePlan>& best);

// A row for a run of ours (not a cuDNN engine): its time per call (time_per_call_ms).
ConvProbeRow timed_row(const char* name, const std::function<bool()>& run);

// x [N, C, H, W] and w [K, C, R, S] in `dtype` (bf16 or f16), channels-last. Engines that compile kernels at
// run time are included (their first run includes the compilation, which is not timed).
std::vector<ConvProbeRow> probe_conv_stats_fusion(DType dtype, const Shape& x, const Shape& w,
                                                  const Conv2dParams& p);

}  // namespace trainer::bench
