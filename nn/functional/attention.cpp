// Scaled dot-product attention composed of bmm and softmax: the [B, H] pairs become one batch of
// [T, d] matrices, so each product is one batched GEMM and the softmax one pass over [B*H*T, S].
// Its memory is O(T * S) per head for the probabilities the backward keeps; the fused kernel that
// may replace it on the GPU keeps only the row statistics.
#include <cmath>
#include <stdexcept>
#include <string>

#include "nn/functional.h"

namespace trainer::F {

Variable scaled_dot_product_attention(const Variable& q, const Variable& k, const Variable& v) {
  const bool shapes_ok = q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.size(0) == q.size(0) &&
                         v.size(0) == q.size(0) && k.size(1) == q.size(1) && v.size(1) == q.size(1) &&
                         k.size(3) == q.size(3) && v.size(2) == k.size(2);
  if (!shapes_ok)
    throw std::invalid_argument(
        "scaled_dot_product_attention: expects q [B, H, T, d], k [B, H, S, d], "
        "v [B, H, S, dv], got " +
        shape_str(q.shape()) + ", " + shape_str(k.shape()) + ", " + shape_str(v.shape()));
  const int64_t batch = q.size(0) * q.size(1), t = q.size(2), s = k.size(2), d = q.size(3), dv = v.size(3);
  // q is scaled before the product: T * d multiplications instead of T * S.
  const Variable q3 = mul(reshape(q, {batch, t, d}), 1.0 / std::sqrt(static_cast<double>(d)));
  const Variable k3 = reshape(k, {batch, s, d}), v3 = reshape(v, {batch, s, dv});
  const Variable scores = bmm(q3, permute(k3, {0, 2, 1}));  // [B*H, T, S]
  const Variable probs = softmax(scores);
  return reshape(bmm(probs, v3), {q.size(0), q.size(1), t, dv});  // [B, H, T, dv]
}

}  // namespace trainer::F
