// The fused attention's entry points on the CUDA backend: the tensors each pass reads and writes,
// allocated here, handed to the problem's cached plans (nn/cuda/fused_attention_plans.h).
#include "nn/cuda/fused_attention.h"

#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <atomic>
#include <optional>

#include "nn/cuda/conv_plan.h"
#include "nn/cuda/cuda_backend.h"
#include "nn/cuda/cuda_common.h"
#include "nn/cuda/fused_attention_plans.h"

namespace trainer {
namespace cuda {
namespace {

using namespace attention;

std::atomic<int64_t> g_forward_calls{0}, g_backward_calls{0};

int64_t round_up(int64_t bytes) { return (bytes + 255) / 256 * 256; }

// grad_out as the backward's plan reads dO: in out's dtype and layout, 16-byte aligned (a copy when not).
Tensor as_out_layout(const Tensor& grad_out, const Tensor& out) {
  if (grad_out.dtype() == out.dtype() && grad_out.strides() == out.strides() &&
      reinterpret_cast<uintptr_t>(grad_out.raw_data()) % 16 == 0)
    return grad_out;
  Tensor copy = heads_inner_empty({out.size(0), out.size(1), out.size(2), out.size(3)}, out.dtype());
  copy.copy_(grad_out);
  return copy;
}

// Fresh gradients in the layout the problem's backward plan writes.
AttentionGrads fresh_gradients(const Problem& p) {
  if (p.packed) {
    Tensor packed = empty({p.b, p.t, 3, p.h, p.d}, p.dtype);
    return {packed_attention_head(packed, 0), packed_attention_head(packed, 1),
            packed_attention_head(packed, 2), packed};
  }
  return {heads_inner_empty({p.b, p.h, p.t, p.d}, p.dtype), heads_inner_empty({p.b, p.h, p.s, p.d}, p.dtype),
          heads_inner_empty({p.b, p.h, p.s, p.dv}, p.dtype), Tensor()};
}

// One allocation for the backward's plan workspace and its two f32 scratch tensors (softmax_sum
// [b, h, t, 1], dq_accum [b, h, t, d]), and where each starts.
struct Scratch {
  Tensor memory;
  void *workspace, *softmax_sum, *dq_accum;
  int64_t dq_accum_bytes;
};
Scratch backward_scratch(const Problem& p, int64_t workspace_bytes) {
  const int64_t ws = round_up(workspace_bytes), sums = round_up(p.b * p.h * p.t * 4);
  Scratch s;
  s.dq_accum_bytes = p.b * p.h * p.t * p.d * 4;
  s.memory = cudnn_conv::workspace(static_cast<size_t>(ws + sums + s.dq_accum_bytes));
  char* base = static_cast<char*>(s.memory.raw_data());
  s.workspace = base, s.softmax_sum = base + ws, s.dq_accum = base + ws + sums;
  return s;
}

}  // namespace

int64_t fused_attention_forward_calls() { return g_forward_calls; }
int64_t fused_attention_backward_calls() { return g_backward_calls; }

}  // namespace cuda

std::optional<AttentionForward> CudaBackend::fused_attention(const Tensor& q, const Tensor& k,
                                                             const Tensor& v, double scale) {
  using namespace cuda::attention;
  if (!cuda_options().fused_attention || cuda_deterministic()) return std::nullopt;
  const std::optional<Problem> p = problem_for(q, k, v);
  Plans* plans = p ? plans_for(*p, true) : nullptr;
  if (!plans) return std::nullopt;
  AttentionForward f{heads_inner_empty({p->b, p->h, p->t, p->dv}, p->dtype),  // [B, H, T, dv]
                     cuda::empty({p->b, p->h, p->t, 1}, DType::f32)};
  const Tensor ws =
      cudnn_conv::workspace(static_cast<size_t>(std::max<int64_t>(plans->forward->workspace_bytes, 1)));
  float scale_value = static_cast<float>(scale);  // by value: read when the plan is queued
  if (!run(*plans, *plans->forward, *p, {kQ, kK, kV, kO, kStats, kScale},
           {q.raw_data(), k.raw_data(), v.raw_data(), f.out.raw_data(), f.stats.raw_data(), &scale_value},
           ws.raw_data(), "forward"))
    return std::nullopt;
  ++cuda::g_forward_calls;
  return f;
}

std::optional<AttentionGrads> CudaBackend::fused_attention_backward(const Tensor& grad_out, const Tensor& q,
                                                                    const Tensor& k, const Tensor& v,
                                                                    const Tensor& out, const Tensor& stats,
                                                                    double scale) {
  using namespace cuda::attention;
  const std::optional<Problem> p = problem_for(q, k, v);
  // Only a forward this backend ran has its plans (the backward's were built with the forward's).
  Plans* plans = p && out.defined() && stats.defined() ? plans_for(*p, false) : nullptr;
  if (!plans || out.shape() != Shape{p->b, p->h, p->t, p->dv} ||
      out.strides() != Shape(p->o_strides.begin(), p->o_strides.end()) || grad_out.shape() != out.shape() ||
      stats.shape() != Shape{p->b, p->h, p->t, 1} || stats.dtype() != DType::f32 || !stats.is_contiguous())
    return std::nullopt;
  const Tensor d_o = cuda::as_out_layout(grad_out, out);
  AttentionGrads g = cuda::fresh_gradients(*p);
  const cuda::Scratch s = cuda::backward_scratch(*p, plans->backward->workspace_bytes);
  // cuDNN before 9.6 accumulates into dq_accum without clearing it first (cudnn-frontend clears it).
  if (cudnnGetVersion() < 90600)
    CUDA_CHECK(cudaMemsetAsync(s.dq_accum, 0, static_cast<size_t>(s.dq_accum_bytes), cuda_stream()));
  float scale_value = static_cast<float>(scale), one = 1.0f;
  if (!run(*plans, *plans->backward, *p,
           {kQ, kK, kV, kO, kDo, kStats, kDq, kDk, kDv, kSoftmaxSum, kDqAccum, kScale, kOne},
           {q.raw_data(), k.raw_data(), v.raw_data(), out.raw_data(), d_o.raw_data(), stats.raw_data(),
            g.grad_q.raw_data(), g.grad_k.raw_data(), g.grad_v.raw_data(), s.softmax_sum, s.dq_accum,
            &scale_value, &one},
           s.workspace, "backward"))
    return std::nullopt;
  ++cuda::g_backward_calls;
  return g;
}

}  // namespace trainer
