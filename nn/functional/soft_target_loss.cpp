// The soft-target losses as differentiable ops: the backend's per-sample losses, their mean over the
// batch, and a backward that weights each sample's gradient by the incoming gradient / N.
#include <stdexcept>
#include <string>
#include <tuple>

#include "nn/amp/autocast.h"
#include "nn/functional.h"

namespace trainer::F {
namespace {

enum class SoftLoss { cross_entropy, bce };

Variable soft_loss(SoftLoss kind, const Variable& logits, const Tensor& targets) {
  const char* name = kind == SoftLoss::bce ? "bce_with_logits" : "soft_cross_entropy";
  if (logits.dim() != 2)
    throw std::invalid_argument(std::string(name) + ": logits must be [N, K], got " +
                                shape_str(logits.shape()));
  const int64_t N = logits.size(0);
  if (N == 0) throw std::invalid_argument(std::string(name) + ": empty batch");
  // Autocast's fp32 list, as cross_entropy: log-softmax and log1p(exp) over half logits lose precision.
  if (autocast_dtype() && is_half(logits.dtype()))
    return soft_loss(kind, to_dtype(logits, DType::f32), targets);
  Backend& k = backend_for(logits.data());
  Tensor per_sample, probs;  // [N]; softmax [N, K] for cross-entropy
  if (kind == SoftLoss::bce)
    per_sample = k.bce_with_logits(logits.data(), targets);
  else
    std::tie(per_sample, probs) = k.soft_cross_entropy(logits.data(), targets);
  const double inv_n = 1.0 / static_cast<double>(N);
  Tensor mean = k.binary_scalar(BinaryOp::mul, k.sum(per_sample, {0}, false), inv_n, false);  // []
  const Tensor saved_logits = kind == SoftLoss::bce ? logits.data() : Tensor();
  return record_op(name, mean, {logits},
                   [kind, probs, saved_logits, targets, inv_n, N](const Tensor& g) -> std::vector<Tensor> {
                     Backend& k = backend_for(g);
                     const Tensor w = k.broadcast_to(k.binary_scalar(BinaryOp::mul, g, inv_n, false), {N});
                     if (kind == SoftLoss::bce) return {k.bce_with_logits_backward(w, saved_logits, targets)};
                     return {k.soft_cross_entropy_backward(w, probs, targets)};
                   });
}

}  // namespace

Variable soft_cross_entropy(const Variable& logits, const Tensor& targets) {
  return soft_loss(SoftLoss::cross_entropy, logits, targets);
}

Variable bce_with_logits(const Variable& logits, const Tensor& targets) {
  return soft_loss(SoftLoss::bce, logits, targets);
}

}  // namespace trainer::F
