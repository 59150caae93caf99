// ConvNeXt's block ends with three elementwise passes over its largest tensors -- the layer scale, drop
// path's per-sample mask and the residual add -- each read and written again in backward, plus a
// column sum for the scale's gradient. Where the backend fuses them (one pass forward, one pass and a
// column reduction backward) the composed form below stays the reference and the CPU's path.
#include "nn/functional.h"

namespace trainer::F {
namespace {

Variable composed(const Variable& x, const Variable& h, const Variable& scale, const Tensor& mask) {
  Variable scaled = mul(h, to_dtype(scale, h.dtype()));
  if (mask.defined()) {
    const Tensor m = mask;
    scaled = record_op(
        "drop_path", backend_for(h.data()).binary(BinaryOp::mul, scaled.data(), m), {scaled},
        [m](const Tensor& g) -> std::vector<Tensor> { return {backend_for(g).binary(BinaryOp::mul, g, m)}; });
  }
  return add(x, scaled);
}

}  // namespace

Variable scaled_residual_add(const Variable& x, const Variable& h, const Variable& scale, double p,
                             bool training, Generator* gen) {
  if (!(p >= 0.0 && p < 1.0))
    throw std::invalid_argument("scaled_residual_add: p must be in [0, 1), got " + std::to_string(p));
  if (x.shape() != h.shape() || h.dim() < 1 || scale.dim() != 1 || scale.size(0) != h.size(-1))
    throw std::invalid_argument("scaled_residual_add: x " + shape_str(x.shape()) + " and h " +
                                shape_str(h.shape()) + " must share a shape [N, ..., C] and scale " +
                                shape_str(scale.shape()) + " be [C]");
  Tensor mask;  // [N, 1, ..., 1], drawn as F::drop_path draws it
  if (training && p > 0.0) {
    if (!gen) throw std::invalid_argument("scaled_residual_add: drop path needs a Generator");
    Shape mask_shape(static_cast<size_t>(h.dim()), 1);
    mask_shape[0] = h.size(0);
    mask = backend_for(h.data()).dropout_mask(mask_shape, p, h.dtype(), *gen);
  }
  const Tensor hd = h.data(), sd = scale.data();
  const Tensor keep = mask.defined() ? mask.reshape({h.size(0)}) : Tensor();
  const bool dense = x.data().is_contiguous() && hd.is_contiguous();
  std::optional<Tensor> y = dense && x.dtype() == h.dtype()
                                ? backend_for(hd).scaled_residual_add(x.data(), hd, sd, keep)
                                : std::nullopt;
  if (!y) return composed(x, h, scale, mask);
  return record_op(
      "scaled_residual_add", *y, {x, h, scale}, [hd, sd, keep](const Tensor& g) -> std::vector<Tensor> {
        auto grads = backend_for(g).scaled_residual_add_backward(g.contiguous(), hd, sd, keep);
        if (!grads)
          throw std::logic_error("scaled_residual_add: the backend fused the forward but not the backward");
        return {g, grads->first, grads->second};
      });
}

}  // namespace trainer::F
