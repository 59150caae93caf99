#include <optional>
#include <stdexcept>
#include <string>

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

Variable expand(const Variable& a, const Shape& shape) {
  if (a.shape() == shape) return a;
  const Shape in_shape = a.shape();
  return record_op(
      "expand", backend_for(a.data()).broadcast_to(a.data(), shape), {a},
      [in_shape](const Tensor& g) -> std::vector<Tensor> { return {sum_to_shape(g, in_shape)}; });
}

Variable cat(const std::vector<Variable>& parts, int dim) {
  if (parts.empty()) throw std::invalid_argument("cat: no tensors to join");
  const Tensor& first = parts[0].data();
  const int d = dim < 0 ? dim + first.dim() : dim;
  if (d < 0 || d >= first.dim()) throw std::invalid_argument("cat: dim out of range");
  Shape shape = first.shape();
  shape[d] = 0;
  for (const Variable& p : parts) {
    Shape other = p.shape();
    if (p.dim() == first.dim()) other[d] = 0;
    if (other != shape || p.dtype() != first.dtype() || p.device() != first.device())
      throw std::invalid_argument("cat: " + shape_str(p.shape()) + " does not join " +
                                  shape_str(first.shape()) + " along dim " + std::to_string(d) +
                                  " (same dtype, device and other sizes)");
  }
  std::vector<int64_t> starts;
  for (const Variable& p : parts) starts.push_back(shape[d]), shape[d] += p.size(d);
  Tensor out = Tensor::empty(shape, first.dtype(), first.device());
  for (size_t i = 0; i < parts.size(); ++i) {
    Tensor window = out.slice(d, starts[i], starts[i] + parts[i].size(d));
    window.copy_(parts[i].data());
  }
  return record_op("cat", out, parts, [d, starts, shape](const Tensor& g) -> std::vector<Tensor> {
    std::vector<Tensor> grads;
    for (size_t i = 0; i < starts.size(); ++i) {
      const int64_t end = i + 1 < starts.size() ? starts[i + 1] : shape[d];
      grads.push_back(g.slice(d, starts[i], end));
    }
    return grads;
  });
}

Variable slice(const Variable& a, int dim, int64_t start, int64_t end) {
  const int d = dim < 0 ? dim + a.dim() : dim;
  if (d < 0 || d >= a.dim() || start < 0 || start > end || end > a.size(d))
    throw std::invalid_argument("slice: [" + std::to_string(start) + ", " + std::to_string(end) +
                                ") along dim " + std::to_string(dim) + " of " + shape_str(a.shape()));
  const Shape in_shape = a.shape();
  return record_op("slice", a.data().slice(d, start, end), {a},
                   [d, start, end, in_shape](const Tensor& g) -> std::vector<Tensor> {
                     Tensor grad = Tensor::zeros(in_shape, g.dtype(), g.device());
                     Tensor window = grad.slice(d, start, end);
                     window.copy_(g);
                     return {grad};
                   });
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
