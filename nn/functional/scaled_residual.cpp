// ConvNeXt's block ends with three elementwise passes over its largest tensors -- the layer scale, drop
// path's per-sample mask and the residual add -- each read and written again in backward, plus a
// column sum for the scale's gradient. Where the backend fuses them (one pass forward, one pass and a
// column reduction backward) the composed form below stays the reference and the CPU's path.
#include "nn/functional.h"

namespace trainer::F {
namespace {

Variable composed(const Variable& x, const Variable& h, const Variable& scale, const Tensor& mask) {
  const Variable scaled = mul(h, to_dtype(scale, h.dtype()));
  return add(x, mask.defined() ? multiply_by_mask("drop_path", scaled, mask) : scaled);
}

}  // namespace

Variable scaled_residual_add(const Variable& x, const Variable& h, const Variable& scale, double p,
                             bool training, Generator* gen) {
  if (!(p >= 0.0 && p < 1.0))
    throw std::invalid_argument("scaled_residual_add: p must be in [0, 1), got " + std::to_string(p));
  Tensor mask;  // [N, 1, ..., 1]
  if (training && p > 0.0) {
    if (!gen) throw std::invalid_argument("scaled_residual_add: drop path needs a Generator");
    if (h.dim() < 1) throw std::invalid_argument("scaled_residual_add: h must have a batch dimension");
    mask = drop_path_mask(h, p, *gen);
  }
  return scaled_residual_add(x, h, scale, mask);
}

Variable scaled_residual_add(const Variable& x, const Variable& h, const Variable& scale,
                             const Tensor& mask) {
  if (x.shape() != h.shape() || h.dim() < 1 || scale.dim() != 1 || scale.size(0) != h.size(-1))
    throw std::invalid_argument("scaled_residual_add: x " + shape_str(x.shape()) + " and h " +
                                shape_str(h.shape()) + " must share a shape [N, ..., C] and scale " +
                                shape_str(scale.shape()) + " be [C]");
  Shape mask_shape(h.dim(), 1);
  mask_shape[0] = h.size(0);
  if (mask.defined() && (mask.shape() != mask_shape || mask.dtype() != h.dtype()))
    throw std::invalid_argument("scaled_residual_add: the mask must be " + shape_str(mask_shape) +
                                " in h's dtype, got " + shape_str(mask.shape()));
  const Tensor hd = h.data(), sd = scale.data();
  const Tensor keep = mask.defined() ? mask.reshape({h.size(0)}) : Tensor();
  // The backend says whether its kernel takes these operands (dtypes, layouts).
  std::optional<Tensor> y = backend_for(hd).scaled_residual_add(x.data(), hd, sd, keep);
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
