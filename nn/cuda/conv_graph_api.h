#pragma once
// A convolution through cuDNN's graph (backend) API: the convolution as a one-operation graph, the
// heuristics' engine configurations that keep the numerics (no TF32 unless BackendOptions::allow_tf32,
// never down-converted inputs or reduced-precision reductions), finalised and timed on the call's
// buffers. This reaches the tensor-core engines that PyTorch uses (with TF32 the legacy API mostly
// offers FMA kernels), and a cached execution plan costs one cudnnBackendExecute per call. The
// building blocks are in nn/cuda/cudnn_graph.h.
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "nn/cuda/conv_plan.h"
#include "nn/cuda/conv_timing.h"
#include "nn/cuda/cudnn_graph.h"

namespace trainer::cudnn_conv {

// Graph-API engine configurations timed per convolution: the heuristics' first. Enough because the
// heuristics rank the fast configurations first: a wider search (mode B's list and the configurations'
// knob neighbours, bench/cudnn_knob_probe) found nothing faster outside them on the one GPU and cuDNN
// version it has run on; rerun it on a new GPU or cuDNN (figures: bench/PERF_NOTES.md, v11).
constexpr size_t kMaxCandidates = 10;

// A one-operation graph with the descriptors it was built from (kept alive with it, as cuDNN's
// frontend does).
struct Graph {
  std::vector<cudnn_graph::BackendDesc> parts;  // tensors, convolution, operation
  cudnn_graph::BackendDesc graph;
  explicit operator bool() const { return static_cast<bool>(graph); }
  // Gives up ownership of every descriptor (a cached plan keeps them for the process's life).
  void release() {
    for (cudnn_graph::BackendDesc& d : parts) d.release();
    graph.release();
  }
};

// The convolution of op as a one-operation graph, or an empty Graph when cuDNN refuses it.
Graph operation_graph(cudnnHandle_t handle, ConvOp op, DType dtype, bool nhwc, const Shape& xs,
                      const Shape& ws, const Shape& ys, const Conv2dParams& p, int64_t alignment);

// Whether the engine of cfg keeps the numerics this dtype asks for.
bool numerics_allowed(cudnnBackendDescriptor_t cfg, DType dtype);

// An engine configuration finalised as an execution plan, with the workspace it needs.
struct GraphCandidate {
  cudnn_graph::BackendDesc plan, cfg;
  size_t workspace;
};

// cfg as a candidate for a convolution in dtype, or nothing when its numerics do not suit dtype, it
// does not finalise, or it needs more than `limit` bytes of workspace.
std::optional<GraphCandidate> graph_candidate(cudnnHandle_t handle, cudnn_graph::BackendDesc cfg, DType dtype,
                                              size_t limit);

// The candidates the trainer times for graph: the first kMaxCandidates usable configurations of
// heuristics mode A, or of the fallback list when mode A offers none.
std::vector<GraphCandidate> heuristic_candidates(cudnnHandle_t handle, cudnnBackendDescriptor_t graph,
                                                 DType dtype, size_t limit);

// The candidates that ran on ptrs = {x or dx, w or dw, y or dy}, with their times (Timed::index: the
// place in `candidates`). One workspace serves all: the largest that can be allocated, and the
// candidates that need more are skipped. In deterministic mode only the first that runs.
std::vector<Timed> time_candidates(cudnnHandle_t handle, const std::vector<GraphCandidate>& candidates,
                                   void* const ptrs[3]);

// The fastest graph-API plan for the convolution (owned by the caller for the process's life, with
// the descriptors it was built from), or nullptr when none runs.
cudnnBackendDescriptor_t graph_plan(ConvOp op, DType dtype, bool nhwc, const Shape& xs, const Shape& ws,
                                    const Shape& ys, const Conv2dParams& p, void* const ptrs[3],
                                    int64_t alignment, size_t& workspace_bytes, float& time_ms);

// Runs plan on ptrs = {x or dx, w or dw, y or dy} with a workspace of the plan's size; throws when
// cuDNN fails.
void execute_graph_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t plan, void* const ptrs[3],
                        void* workspace);

}  // namespace trainer::cudnn_conv
