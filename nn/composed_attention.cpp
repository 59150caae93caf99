#include "nn/composed_attention.h"

namespace trainer {
namespace {

// A [B, H, R, C] tensor as the [B * H, R, C] batch of matrices bmm takes (a copy when its strides do
// not allow a view).
Tensor as_batch(const Tensor& t) { return t.reshape({t.size(0) * t.size(1), t.size(2), t.size(3)}); }

// scale * q, the operand of the scores: T * d multiplications instead of T * S.
Tensor scaled_q(Backend& b, const Tensor& q, double scale) {
  return b.binary_scalar(BinaryOp::mul, as_batch(q), scale, false);  // [B*H, T, d]
}

}  // namespace

Tensor composed_attention(Backend& b, const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  const Tensor probs = b.softmax(b.bmm(scaled_q(b, q, scale), as_batch(k), false, true));  // [B*H, T, S]
  return b.bmm(probs, as_batch(v), false, false).reshape({q.size(0), q.size(1), q.size(2), v.size(3)});
}

AttentionGrads composed_attention_backward(Backend& b, const Tensor& grad_out, const Tensor& q,
                                           const Tensor& k, const Tensor& v, double scale) {
  const Tensor qs = scaled_q(b, q, scale), k3 = as_batch(k), v3 = as_batch(v);
  const Tensor g3 = as_batch(grad_out);                        // [B*H, T, dv]
  const Tensor probs = b.softmax(b.bmm(qs, k3, false, true));  // [B*H, T, S]
  const Tensor grad_v = b.bmm(probs, g3, true, false);         // [B*H, S, dv]
  const Tensor grad_scores =                                   // [B*H, T, S]
      b.softmax_backward(b.bmm(g3, v3, false, true), probs);
  // scores = (scale q) k^T: d/dq = scale * dS k, d/dk = dS^T (scale q).
  const Tensor grad_q = b.binary_scalar(BinaryOp::mul, b.bmm(grad_scores, k3, false, false), scale, false);
  const Tensor grad_k = b.bmm(grad_scores, qs, true, false);  // [B*H, S, d]
  return {grad_q.reshape(q.shape()), grad_k.reshape(k.shape()), grad_v.reshape(v.shape()), Tensor()};
}

}  // namespace trainer
