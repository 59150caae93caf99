#pragma once
// cuDNN operation graphs of scaled dot-product attention, forward and backward, in the form cuDNN's
// fused flash-attention engines recognise (the composite graph cudnn-frontend's SDPA nodes build for
// bf16/f16 on sm80/sm90): matmul -> scale -> softmax as max/sub/exp/sum/div with the statistics
// max + log(sum) -> matmul, and the backward's chain of matmuls over the recomputed exp(S - stats).
// The engines keep the scores on chip: nothing [T, S] reaches memory. nn/cuda/fused_attention.cpp
// builds, caches and runs them.
#include <array>
#include <cstdint>

#include "nn/cuda/conv_stats_graph.h"
#include "nn/dtype.h"

namespace trainer::cuda::attention {

using Dims = std::array<int64_t, 4>;

// One attention problem: q [b, h, t, d], k [b, h, s, d], v [b, h, s, dv] with their strides in
// elements; o and its gradient share o's strides; dq, dk, dv the gradients' (the backward only).
struct Problem {
  DType dtype = DType::bf16;  // bf16 or f16
  int64_t b = 0, h = 0, t = 0, s = 0, d = 0, dv = 0;
  Dims q_strides{}, k_strides{}, v_strides{}, o_strides{};
  Dims dq_strides{}, dk_strides{}, dv_strides{};
  // q, k and v are the views of one packed [b, t, 3, h, d] tensor, and so are the gradients.
  bool packed = false;
};

// Tensor ids in the variant packs. kScale and kOne are host floats passed by value; kSoftmaxSum
// (f32 [b, h, t, 1]: the rows' sum of dO * O) and kDqAccum (f32 [b, h, t, d]: dQ accumulated across
// key blocks) are the backward's scratch, in memory the caller provides.
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kScale,
  kDo,
  kDq,
  kDk,
  kDv,
  kSoftmaxSum,
  kDqAccum,
  kOne,
  kFirstVirtual = 100,
};

// The graphs, finalised for `handle`, or an empty OpGraph (graph undefined) when cuDNN refuses a part
// (TRAINER_CUDNN_DEBUG=1 names the call). Forward: q, k, v, scale -> o, stats. Backward: q, k, v, o,
// dO, stats, scale, one -> dq, dk, dv, with the two scratch tensors.
conv_stats::OpGraph build_forward(cudnnHandle_t handle, const Problem& p);
conv_stats::OpGraph build_backward(cudnnHandle_t handle, const Problem& p);

}  // namespace trainer::cuda::attention
