#pragma once
// The fused attention's plans (nn/cuda/fused_attention.h): which tensors the cuDNN graphs take and how
// they are laid out (a Problem), the plans built once per problem and cached for the process, and
// running one. The backend's entry points (nn/cuda/fused_attention.cpp) allocate and hand in the
// tensors.
#include <atomic>
#include <optional>
#include <string>
#include <vector>

#include "nn/cuda/fused_attention_graph.h"
#include "nn/tensor.h"

namespace trainer::cuda::attention {

// The problem q, k, v pose, or nullopt where the fused graphs do not apply (see fused_attention.h).
// The output's strides are those of heads_inner_empty; the gradients' are the inputs' own when q, k
// and v are packed views of one tensor (then they land in one packed tensor too), else
// heads_inner_empty's.
std::optional<Problem> problem_for(const Tensor& q, const Tensor& k, const Tensor& v);

// A fresh [B, H, R, C] tensor laid out as [B, R, H, C] (dims given as [B, H, R, C]): each row's heads
// side by side.
Tensor heads_inner_empty(const Dims& dims, DType dtype);

// A problem's plans, kept with the graphs and engine configurations they were made from.
struct Plans {
  conv_stats::OpGraph forward_graph, backward_graph;
  cudnn_graph::BackendDesc forward_config, backward_config;
  std::optional<conv_stats::Plan> forward, backward;
  // False when cuDNN refused either, or either failed to run once: the problem runs composed.
  std::atomic<bool> usable{false};
};

// The problem's plans, built at its first call outside a CUDA graph capture when `may_build`; null where
// there are none that are usable.
Plans* plans_for(const Problem& p, bool may_build);

// Runs plan (one of plans') on the pointers of `uids`; on failure warns once, marks the plans unusable
// and returns false. `what` names the pass in the warning.
bool run(Plans& plans, const conv_stats::Plan& plan, const Problem& p, const std::vector<int64_t>& uids,
         const std::vector<void*>& ptrs, void* workspace, const char* what);

}  // namespace trainer::cuda::attention
