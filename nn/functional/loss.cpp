#include <stdexcept>
#include <string>

#include "nn/amp/autocast.h"
#include "nn/functional.h"

namespace trainer::F {

Variable cross_entropy(const Variable& logits, const Tensor& targets, double label_smoothing) {
  if (logits.dim() != 2)
    throw std::invalid_argument("cross_entropy: logits must be [N, K], got " + shape_str(logits.shape()));
  const int64_t N = logits.size(0);
  if (N == 0) throw std::invalid_argument("cross_entropy: empty batch");
  // Autocast's fp32 list: log-softmax over half logits loses the small probabilities.
  if (autocast_dtype() && is_half(logits.dtype()))
    return cross_entropy(to_dtype(logits, DType::f32), targets, label_smoothing);
  Backend& k = backend_for(logits.data());
  auto [loss, probs] = k.cross_entropy(logits.data(), targets, label_smoothing);  // [N], [N, K]
  const double inv_n = 1.0 / static_cast<double>(N);
  Tensor mean = k.binary_scalar(BinaryOp::mul, k.sum(loss, {0}, false), inv_n, false);  // []
  // The loader may refill the targets' buffer before backward runs; N integers are cheap to keep.
  const Tensor saved_targets = targets.clone();
  return record_op("cross_entropy", mean, {logits},
                   [probs, saved_targets, label_smoothing, inv_n, N](const Tensor& g) -> std::vector<Tensor> {
                     Backend& k = backend_for(g);
                     const Tensor w = k.broadcast_to(k.binary_scalar(BinaryOp::mul, g, inv_n, false), {N});
                     return {k.cross_entropy_backward(w, probs, saved_targets, label_smoothing)};
                   });
}

int64_t topk_correct(const Tensor& logits, const Tensor& targets, int k) {
  const std::vector<uint8_t> hits = backend_for(logits).topk_correct(logits, targets, k).to_vector<uint8_t>();
  int64_t n = 0;
  for (uint8_t h : hits) n += h;
  return n;
}

}  // namespace trainer::F
