// Dropout masks: drawn on the host from the Generator in element order (exactly as the CPU backend
// does) and copied to the device, so a run draws the same masks on either device. Host code only.
#include "nn/random.h"

#include "nn/cuda/cuda_common.h"

namespace trainer {

Tensor CudaBackend::dropout_mask(const Shape& shape, double p, DType dtype, Generator& gen) {
  return cpu_backend().dropout_mask(shape, p, dtype, gen).to(cuda::current_device());
}

}  // namespace trainer
