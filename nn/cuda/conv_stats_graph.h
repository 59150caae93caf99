#pragma once
// cuDNN operation graphs for a convolution whose epilogue also computes the per-channel sum and sum
// of squares of its output (what BatchNorm's batch statistics need), and the pieces to run and time
// their engines. Used by the fusion itself (nn/cuda/conv_stats_fusion.h) and by its measurement
// (bench/cudnn/conv_stats_fusion_probe.h). Tensors are channels-last (NHWC) in bf16 or f16; the sums
// are f32 [1, C, 1, 1].
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <vector>

#include "nn/cuda/cudnn_graph.h"

namespace trainer::cuda::conv_stats {

// Tensor ids in the variant packs (kSquare: the virtual y * y of the reduction pattern). Graphs built
// elsewhere from these pieces (bench/cudnn/conv_prologue_graph.h) number theirs from kFirstFreeUid.
constexpr int64_t kX = 1, kW = 2, kY = 3, kSum = 4, kSqSum = 5, kSquare = 6, kFirstFreeUid = 7;

enum class Pattern {
  conv,       // the convolution alone
  genstats,   // + cuDNN's dedicated statistics operation (the ConvBNfprop pattern's epilogue)
  reduction,  // + generic reductions of y and y * y over N, H, W (runtime fusion)
};

// The operations of one graph and every descriptor they were built from (kept alive with them).
struct OpGraph {
  std::deque<cudnn_graph::BackendDesc> parts;  // a deque: references to earlier parts stay valid
  std::vector<cudnnBackendDescriptor_t> ops;
  cudnn_graph::BackendDesc graph;
  cudnn_graph::BackendDesc& keep(cudnn_graph::BackendDesc d);
  bool add_op(cudnn_graph::BackendDesc op);
  bool finalize(cudnnHandle_t handle);
};

// The graph of `pattern` for x [N, C, H, W] * w [K, C, R, S] -> y (shape ys), or an empty OpGraph
// (graph undefined) when cuDNN refuses it (TRAINER_CUDNN_DEBUG=1 names the call).
OpGraph build(Pattern pattern, cudnnHandle_t handle, DType dtype, const Shape& xs, const Shape& ws,
              const Shape& ys, const Conv2dParams& p);

// The uids of `pattern`'s variant pack, in order: x, w, y (+ sum, sqsum).
std::vector<int64_t> pack_uids(Pattern pattern);

// The pieces the graphs are built of: each adds one finalised operation to g (and keeps what it was
// built from), false when cuDNN refuses. Descriptors are g's tensors, made with cudnn_graph::tensor_desc.
// y = conv(x, w) under p (cross-correlation), accumulating in f32.
bool add_conv_forward(OpGraph& g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t w,
                      cudnnBackendDescriptor_t y, const Conv2dParams& p);
// The per-channel sum and sum of squares of y, by cuDNN's dedicated statistics operation.
bool add_genstats(OpGraph& g, cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t sum,
                  cudnnBackendDescriptor_t sqsum);
// out = mode(in, b) elementwise in f32; b is null for a unary mode (CUDNN_POINTWISE_RELU_FWD).
bool add_pointwise(OpGraph& g, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t in,
                   cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t out);

// A finalised execution plan and its workspace size. Finalising is where a runtime-fusion engine
// compiles its kernel.
struct Plan {
  cudnn_graph::BackendDesc plan;
  int64_t workspace_bytes = 0;
  // Runs the plan on these pointers (in pack_uids order) with a workspace of workspace_bytes.
  bool execute(const std::vector<int64_t>& uids, const std::vector<void*>& ptrs, void* workspace) const;
};
// The plan of engine configuration cfg, or nothing when it does not finalise or wants more than
// `max_workspace` bytes.
std::optional<Plan> finalize_plan(cudnnBackendDescriptor_t cfg, int64_t max_workspace);

// Milliseconds per call of `run`: `runs` calls queued back to back between two events (so launch
// latency hides behind the previous call, as in a training step), best of `rounds` after a warm-up;
// infinity when a call fails.
float time_per_call_ms(const std::function<bool()>& run, int runs = 50, int rounds = 3);

}  // namespace trainer::cuda::conv_stats
