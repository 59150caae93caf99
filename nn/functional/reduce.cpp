#include "nn/functional.h"

namespace trainer::F {
namespace {

std::vector<int> normalized_dims(const std::vector<int>& dims, int nd) {
  std::vector<int> out;
  if (dims.empty())
    for (int d = 0; d < nd; ++d) out.push_back(d);
  for (int d : dims) out.push_back(d < 0 ? d + nd : d);
  return out;
}

}  // namespace

Tensor sum_to_shape(const Tensor& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  const int lead = grad.dim() - static_cast<int>(shape.size());
  std::vector<int> dims;
  for (int d = 0; d < grad.dim(); ++d)
    if (d < lead || (shape[d - lead] == 1 && grad.shape()[d] != 1)) dims.push_back(d);
  Tensor s = backend_for(grad).sum(grad, dims, true);
  return s.reshape(shape);
}

Variable sum(const Variable& a, const std::vector<int>& dims_in, bool keepdim) {
  const std::vector<int> dims = normalized_dims(dims_in, a.dim());
  Tensor y = backend_for(a.data()).sum(a.data(), dims, keepdim);
  const Shape in_shape = a.shape();
  return record_op("sum", y, {a}, [dims, in_shape](const Tensor& g) -> std::vector<Tensor> {
    Shape kept = in_shape;
    for (int d : dims) kept[d] = 1;
    return {backend_for(g).broadcast_to(g.reshape(kept), in_shape)};
  });
}

Variable mean(const Variable& a, const std::vector<int>& dims_in, bool keepdim) {
  const std::vector<int> dims = normalized_dims(dims_in, a.dim());
  int64_t count = 1;
  for (int d : dims) count *= a.shape()[d];
  return mul(sum(a, dims, keepdim), 1.0 / static_cast<double>(count));
}

}  // namespace trainer::F
