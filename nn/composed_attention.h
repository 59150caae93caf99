#pragma once
// Attention composed of the backend's bmm and softmax, forward and backward, on plain tensors (no
// autograd): what stands in for a fused backward the backend cannot run (nn/functional/attention.cpp)
// and the op table's reference for Backend::fused_attention. F::scaled_dot_product_attention's own
// composed path records the same products as autograd ops.
#include "nn/backend.h"

namespace trainer {

// softmax(scale * q k^T) v per batch entry and head: q [B, H, T, d], k [B, H, S, d], v [B, H, S, dv]
// (any strides) -> [B, H, T, dv], contiguous, in q's dtype.
Tensor composed_attention(Backend& b, const Tensor& q, const Tensor& k, const Tensor& v, double scale);

// Its gradients for grad_out [B, H, T, dv], the probabilities recomputed from q and k; `packed` is left
// undefined.
AttentionGrads composed_attention_backward(Backend& b, const Tensor& grad_out, const Tensor& q,
                                           const Tensor& k, const Tensor& v, double scale);

}  // namespace trainer
