// Random kernels: the dropout mask.
#include "nn/random.h"

#include "nn/cpu/cpu_backend.h"

namespace trainer {

Tensor CpuBackend::dropout_mask(const Shape& shape, double p, DType dtype, Generator& gen) {
  if (!(p >= 0.0 && p < 1.0))
    throw std::invalid_argument("dropout_mask: p must be in [0, 1), got " + std::to_string(p));
  if (dtype == DType::f16 || dtype == DType::bf16) return dropout_mask(shape, p, DType::f32, gen).to(dtype);
  Tensor mask = Tensor::empty(shape, dtype);
  // One uniform draw per element in row-major order, so every backend that draws on the host (and
  // a rerun from the same generator state) produces the same mask.
  TRAINER_DISPATCH_FLOAT(dtype, "dropout_mask", [&] {
    scalar_t* m = mask.data<scalar_t>();
    const scalar_t keep = static_cast<scalar_t>(1.0 / (1.0 - p));
    for (int64_t i = 0; i < mask.numel(); ++i) m[i] = gen.uniform() < p ? scalar_t(0) : keep;
  });
  return mask;
}

}  // namespace trainer
