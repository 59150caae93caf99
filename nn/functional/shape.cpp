#include <optional>

#include "nn/functional.h"

namespace trainer::F {

Variable reshape(const Variable& a, const Shape& shape) {
  const Shape in_shape = a.shape();
  return record_op("reshape", a.data().reshape(shape), {a},
                   [in_shape](const Tensor& g) -> std::vector<Tensor> { return {g.reshape(in_shape)}; });
}

Variable flatten(const Variable& a, int start_dim) {
  Shape shape(a.shape().begin(), a.shape().begin() + start_dim);
  shape.push_back(-1);
  return reshape(a, shape);
}

Variable permute(const Variable& a, const std::vector<int>& order) {
  std::vector<int> inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i) inverse[order[i] < 0 ? order[i] + order.size() : order[i]] = i;
  return record_op("permute", a.data().permute(order), {a},
                   [inverse](const Tensor& g) -> std::vector<Tensor> { return {g.permute(inverse)}; });
}

Variable contiguous(const Variable& a, MemoryFormat format) {
  Tensor out = a.data().contiguous(format);  // may only restride size-1 dimensions (no copy)
  if (out.same_storage(a.data()) && out.strides() == a.data().strides()) return a;
  return record_op("contiguous", out, {a}, [](const Tensor& g) -> std::vector<Tensor> { return {g}; });
}

Variable to_dtype(const Variable& a, DType dtype, std::optional<MemoryFormat> format) {
  if (!a.defined()) return a;
  const Tensor& x = a.data();
  const MemoryFormat from_format = x.suggest_memory_format(), to_format = format.value_or(from_format);
  if (x.dtype() == dtype && x.is_contiguous(to_format)) return a;
  // One pass converts dtype and layout together (a cast weight lands in the activations' layout).
  auto convert = [](const Tensor& t, DType d, MemoryFormat f) {
    Tensor out = Tensor::empty(t.shape(), d, t.device(), f);
    out.copy_(t);
    return out;
  };
  const DType from = x.dtype();
  return record_op("to_dtype", convert(x, dtype, to_format), {a},
                   [from, from_format, convert](const Tensor& g) -> std::vector<Tensor> {
                     return {convert(g, from, from_format)};
                   });
}

}  // namespace trainer::F
