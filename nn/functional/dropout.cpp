#include "nn/functional.h"
#include "nn/random.h"

namespace trainer::F {

Variable dropout(const Variable& x, double p, bool training, Generator& gen) {
  if (!(p >= 0.0 && p < 1.0))
    throw std::invalid_argument("dropout: p must be in [0, 1), got " + std::to_string(p));
  if (!training || p == 0.0) return x;
  Backend& k = backend_for(x.data());
  const Tensor mask = k.dropout_mask(x.shape(), p, x.dtype(), gen);  // 0 or 1 / (1 - p)
  return record_op("dropout", k.binary(BinaryOp::mul, x.data(), mask), {x},
                   [mask](const Tensor& g) -> std::vector<Tensor> {
                     return {backend_for(g).binary(BinaryOp::mul, g, mask)};
                   });
}

}  // namespace trainer::F
