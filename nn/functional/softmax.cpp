// Softmax over the last dimension.
//
// Autocast: PyTorch's autocast runs softmax in f32 (its fp32 list). A half input is not cast here:
// the kernels compute in f32 and round only the probabilities, which attention's next op (the
// product with V) casts to the half dtype in PyTorch too. The layer_norm comment
// (nn/functional/layer_norm.cpp) says the same of layer norm.
#include "nn/functional.h"

namespace trainer::F {

Variable softmax(const Variable& x) {
  Tensor y = backend_for(x.data()).softmax(x.data());
  return record_op("softmax", y, {x}, [y](const Tensor& g) -> std::vector<Tensor> {
    return {backend_for(g).softmax_backward(g, y)};
  });
}

}  // namespace trainer::F
