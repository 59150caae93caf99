// Scaled dot-product attention. Where the backend has a fused kernel for the inputs
// (Backend::fused_attention: cuDNN's flash attention for bf16/f16 on a GPU), one op runs it and keeps
// for the backward only its inputs, output and each row's softmax statistics. Otherwise attention is
// composed of bmm and softmax over the [B*H] heads as one batch, which keeps the O(T * S)
// probabilities per head and stays the reference: the CPU's path, the GPU's in f32, and the path
// BackendOptions::fused_attention = false forces.
#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>

#include "nn/composed_attention.h"
#include "nn/functional.h"

namespace trainer::F {
namespace {

void check_shapes(const Tensor& q, const Tensor& k, const Tensor& v) {
  const bool shapes_ok = q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.size(0) == q.size(0) &&
                         v.size(0) == q.size(0) && k.size(1) == q.size(1) && v.size(1) == q.size(1) &&
                         k.size(3) == q.size(3) && v.size(2) == k.size(2);
  if (!shapes_ok)
    throw std::invalid_argument(
        "scaled_dot_product_attention: expects q [B, H, T, d], k [B, H, S, d], "
        "v [B, H, S, dv], got " +
        shape_str(q.shape()) + ", " + shape_str(k.shape()) + ", " + shape_str(v.shape()));
}

double scale_for(const Tensor& q) { return 1.0 / std::sqrt(static_cast<double>(q.size(3))); }

// The composed form, op by op under autograd: the [B, H] pairs become one batch of [T, d] matrices,
// so each product is one batched GEMM and the softmax one pass over [B*H*T, S].
Variable composed(const Variable& q, const Variable& k, const Variable& v) {
  const int64_t batch = q.size(0) * q.size(1), t = q.size(2), s = k.size(2), d = q.size(3), dv = v.size(3);
  // q is scaled before the product: T * d multiplications instead of T * S.
  const Variable q3 = mul(reshape(q, {batch, t, d}), scale_for(q.data()));
  const Variable k3 = reshape(k, {batch, s, d}), v3 = reshape(v, {batch, s, dv});
  const Variable scores = bmm(q3, permute(k3, {0, 2, 1}));  // [B*H, T, S]
  const Variable probs = softmax(scores);
  return reshape(bmm(probs, v3), {q.size(0), q.size(1), t, dv});  // [B, H, T, dv]
}

// What the fused op's backward reads, saved by its forward.
struct FusedSaved {
  Tensor q, k, v, out, stats;
  double scale;
};

// The fused kernel's gradients for grad_out; where the backend cannot run it (it no longer holds this
// forward's plan), the composed form's, recomputed from q, k and v: the gradients of the same function.
AttentionGrads fused_gradients(const Tensor& grad_out, const FusedSaved& s) {
  Backend& b = backend_for(s.q);
  if (std::optional<AttentionGrads> g =
          b.fused_attention_backward(grad_out, s.q, s.k, s.v, s.out, s.stats, s.scale))
    return *g;
  return composed_attention_backward(b, grad_out, s.q, s.k, s.v, s.scale);
}

// The gradient of a packed qkv [N, T, 3, H, d]: the backend's packed tensor, or the three gradients
// copied into one.
Tensor packed_gradient(const AttentionGrads& g, const Shape& qkv_shape) {
  if (g.packed.defined()) return g.packed;
  Tensor packed = Tensor::empty(qkv_shape, g.grad_q.dtype(), g.grad_q.device());
  const Tensor* parts[3] = {&g.grad_q, &g.grad_k, &g.grad_v};
  for (int which = 0; which < 3; ++which) {
    Tensor head = packed_attention_head(packed, which);
    head.copy_(*parts[which]);
  }
  return packed;
}

}  // namespace

Variable scaled_dot_product_attention(const Variable& q, const Variable& k, const Variable& v) {
  check_shapes(q.data(), k.data(), v.data());
  const double scale = scale_for(q.data());
  std::optional<AttentionForward> f =
      backend_for(q.data()).fused_attention(q.data(), k.data(), v.data(), scale);
  if (!f) return composed(q, k, v);
  const FusedSaved saved{q.data(), k.data(), v.data(), f->out, f->stats, scale};
  return record_op("scaled_dot_product_attention", f->out, {q, k, v},
                   [saved](const Tensor& g) -> std::vector<Tensor> {
                     const AttentionGrads grads = fused_gradients(g, saved);
                     return {grads.grad_q, grads.grad_k, grads.grad_v};
                   });
}

Variable packed_self_attention(const Variable& qkv) {
  if (qkv.dim() != 5 || qkv.size(2) != 3)
    throw std::invalid_argument("packed_self_attention: expects qkv [N, T, 3, H, d], got " +
                                shape_str(qkv.shape()));
  const Tensor& packed = qkv.data();
  const Tensor q = packed_attention_head(packed, 0), k = packed_attention_head(packed, 1),
               v = packed_attention_head(packed, 2);  // [N, H, T, d] views
  const double scale = scale_for(q);
  std::optional<AttentionForward> f = backend_for(packed).fused_attention(q, k, v, scale);
  if (!f) {
    const int64_t n = qkv.size(0), t = qkv.size(1), h = qkv.size(3), d = qkv.size(4);
    auto heads_of = [&](int64_t which) {  // q, k or v as [N, H, T, d]
      return permute(reshape(slice(qkv, 2, which, which + 1), {n, t, h, d}), {0, 2, 1, 3});
    };
    return permute(composed(heads_of(0), heads_of(1), heads_of(2)), {0, 2, 1, 3});
  }
  const FusedSaved saved{q, k, v, f->out, f->stats, scale};
  // The fused output is [N, T, H, d] in memory: this permute is a view of it, contiguous.
  return record_op("packed_self_attention", f->out.permute({0, 2, 1, 3}), {qkv},
                   [saved, shape = packed.shape()](const Tensor& g) -> std::vector<Tensor> {
                     return {packed_gradient(fused_gradients(g.permute({0, 2, 1, 3}), saved), shape)};
                   });
}

}  // namespace trainer::F
