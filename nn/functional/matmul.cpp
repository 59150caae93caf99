#include "nn/amp/autocast.h"
#include "nn/functional.h"

namespace trainer::F {

Variable matmul(const Variable& a, const Variable& b) {
  if (autocast_applies({a.dtype(), b.dtype()})) {
    const DType half = *autocast_dtype();
    return matmul(to_dtype(a, half), to_dtype(b, half));
  }
  Backend& k = backend_for(a.data());
  const Tensor ta = a.data(), tb = b.data();
  return record_op("matmul", k.matmul(ta, tb, false, false), {a, b},
                   [ta, tb](const Tensor& g) -> std::vector<Tensor> {
                     Backend& k = backend_for(g);
                     return {k.matmul(g, tb, false, true), k.matmul(ta, g, true, false)};  // g b^T, a^T g
                   });
}

Variable bmm(const Variable& a, const Variable& b) {
  if (autocast_applies({a.dtype(), b.dtype()})) {
    const DType half = *autocast_dtype();
    return bmm(to_dtype(a, half), to_dtype(b, half));
  }
  Backend& k = backend_for(a.data());
  const Tensor ta = a.data(), tb = b.data();
  return record_op(
      "bmm", k.bmm(ta, tb, false, false), {a, b}, [ta, tb](const Tensor& g) -> std::vector<Tensor> {
        Backend& k = backend_for(g);
        return {k.bmm(g, tb, false, true), k.bmm(ta, g, true, false)};  // g b^T, a^T g per matrix
      });
}

Variable linear(const Variable& x, const Variable& weight, const Variable& bias) {
  if (x.dim() < 1) throw std::invalid_argument("linear: input must be [..., in], got a scalar");
  if (weight.size(1) != x.size(-1))
    throw std::invalid_argument("linear: input has " + std::to_string(x.size(-1)) +
                                " features, weight expects " + std::to_string(weight.size(1)));
  if (x.dim() != 2) {
    // [..., in] as one [M, in] GEMM: a view when x is contiguous (a channels-last map permuted to
    // NHWC is), a copy otherwise; the result [M, out] is contiguous, so reshaping it back is a view.
    Shape out_shape = x.shape();
    out_shape.back() = weight.size(0);
    return reshape(linear(reshape(x, {-1, x.size(-1)}), weight, bias), out_shape);
  }
  if (autocast_applies({x.dtype(), weight.dtype(), bias.defined() ? bias.dtype() : x.dtype()})) {
    const DType half = *autocast_dtype();
    return linear(to_dtype(x, half), to_dtype(weight, half), to_dtype(bias, half));
  }
  Backend& k = backend_for(x.data());
  const Tensor tx = x.data(), tw = weight.data();
  const bool has_bias = bias.defined();
  std::optional<Tensor> fused = has_bias ? k.linear_fused(tx, tw, bias.data()) : std::nullopt;
  Tensor y = fused ? *fused : k.matmul(tx, tw, false, true);  // [N, out]
  if (has_bias && !fused) y = k.binary(BinaryOp::add, y, bias.data());
  std::vector<Variable> inputs{x, weight};
  if (has_bias) inputs.push_back(bias);
  return record_op("linear", y, inputs, [tx, tw, has_bias](const Tensor& g) -> std::vector<Tensor> {
    Backend& k = backend_for(g);
    const Tensor grad_x = k.matmul(g, tw, false, false);
    if (!has_bias) return {grad_x, k.matmul(g, tx, true, false)};
    if (auto fused = k.linear_weight_grads_fused(g, tx)) return {grad_x, fused->first, fused->second};
    return {grad_x, k.matmul(g, tx, true, false), k.sum(g, {0}, false)};
  });
}

}  // namespace trainer::F
