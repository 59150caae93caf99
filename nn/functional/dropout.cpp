#include "nn/functional.h"
#include "nn/random.h"

namespace trainer::F {
namespace {

void check_probability(const char* op, double p) {
  if (!(p >= 0.0 && p < 1.0))
    throw std::invalid_argument(std::string(op) + ": p must be in [0, 1), got " + std::to_string(p));
}

}  // namespace

// x * mask, where mask (0 or 1 / (1 - p)) is x's shape or broadcasts to it; the gradient is g * mask.
Variable multiply_by_mask(const char* name, const Variable& x, const Tensor& mask) {
  Backend& k = backend_for(x.data());
  return record_op(name, k.binary(BinaryOp::mul, x.data(), mask), {x},
                   [mask](const Tensor& g) -> std::vector<Tensor> {
                     return {backend_for(g).binary(BinaryOp::mul, g, mask)};
                   });
}

Tensor drop_path_mask(const Variable& x, double p, Generator& gen) {
  check_probability("drop_path", p);
  if (x.dim() < 1) throw std::invalid_argument("drop_path: input must have a batch dimension");
  // One draw per sample: dropout's mask of shape [N, 1, ..., 1] broadcasts over the rest, so both
  // backends run it with the kernels they have and draw the same masks.
  Shape mask_shape(x.dim(), 1);
  mask_shape[0] = x.size(0);
  return backend_for(x.data()).dropout_mask(mask_shape, p, x.dtype(), gen);
}

Variable dropout(const Variable& x, double p, bool training, Generator& gen) {
  check_probability("dropout", p);
  if (!training || p == 0.0) return x;
  return multiply_by_mask("dropout", x, backend_for(x.data()).dropout_mask(x.shape(), p, x.dtype(), gen));
}

Variable drop_path(const Variable& x, double p, bool training, Generator& gen) {
  check_probability("drop_path", p);
  if (!training || p == 0.0) return x;
  return multiply_by_mask("drop_path", x, drop_path_mask(x, p, gen));
}

}  // namespace trainer::F
