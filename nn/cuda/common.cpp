#include <algorithm>
#include <stdexcept>
#include <string>

#include "nn/cuda/cuda_common.h"

namespace trainer::cuda {

void coalesce(Shape& shape, std::vector<Shape>& strides) {
  Shape s;
  std::vector<Shape> st(strides.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !s.empty();
    for (size_t k = 0; k < strides.size() && merge; ++k) merge = st[k].back() == strides[k][d] * shape[d];
    if (merge) {
      s.back() *= shape[d];
      for (size_t k = 0; k < strides.size(); ++k) st[k].back() = strides[k][d];
    } else {
      s.push_back(shape[d]);
      for (size_t k = 0; k < strides.size(); ++k) st[k].push_back(strides[k][d]);
    }
  }
  shape = std::move(s);
  strides = std::move(st);
}

void order_by_destination_strides(Shape& shape, std::vector<Shape>& strides) {
  std::vector<size_t> order(shape.size());
  for (size_t d = 0; d < order.size(); ++d) order[d] = d;
  const Shape& key = strides[0];
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key[a] > key[b]; });
  Shape s(shape.size());
  std::vector<Shape> st(strides.size(), Shape(shape.size()));
  for (size_t d = 0; d < order.size(); ++d) {
    s[d] = shape[order[d]];
    for (size_t k = 0; k < strides.size(); ++k) st[k][d] = strides[k][order[d]];
  }
  shape = std::move(s);
  strides = std::move(st);
}

Indexer make_indexer(const Shape& shape, const Shape& strides, const char* op) {
  if (shape.size() > static_cast<size_t>(kMaxDims))
    throw std::invalid_argument(std::string(op) + ": the CUDA backend walks at most " +
                                std::to_string(kMaxDims) + " non-mergeable dims, got shape " +
                                shape_str(shape));
  Indexer ix;
  ix.nd = static_cast<int>(shape.size());
  for (int d = 0; d < ix.nd; ++d) {
    ix.size[d] = shape[d];
    ix.stride[d] = strides[d];
  }
  return ix;
}

bool is_flat(const Indexer& ix) { return ix.nd == 0 || (ix.nd == 1 && ix.stride[0] == 1); }

Device current_device() { return Device::cuda(cuda_context().device); }

Tensor empty(const Shape& shape, DType dtype, MemoryFormat format) {
  return Tensor::empty(shape, dtype, current_device(), format);
}

void check_device(const Tensor& t, const char* op, const char* name) {
  if (!t.defined()) throw std::invalid_argument(std::string(op) + ": " + name + " is undefined");
  if (t.device() != current_device())
    throw std::invalid_argument(std::string(op) + ": " + name + " is on " + t.device().str() + ", expected " +
                                current_device().str() +
                                ". HINT: move every input to the same device with .to(device)");
}

void check_floating(DType dtype, const char* op) {
  if (!is_floating(dtype))
    throw std::invalid_argument(std::string(op) + ": needs a floating dtype, got " +
                                std::string(dtype_name(dtype)));
}

void check_same_dtype(const Tensor& a, const Tensor& b, const char* op) {
  if (a.dtype() != b.dtype())
    throw std::invalid_argument(std::string(op) + ": dtype mismatch " + std::string(dtype_name(a.dtype())) +
                                " vs " + std::string(dtype_name(b.dtype())));
}

bool is_dense(const Tensor& t) { return t.is_contiguous() || t.is_contiguous(MemoryFormat::channels_last); }

MemoryFormat dense_format(const Tensor& t) { return t.suggest_memory_format(); }

bool same_layout(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  for (int d = 0; d < a.dim(); ++d)
    if (a.size(d) > 1 && a.stride(d) != b.stride(d)) return false;
  return true;
}

unsigned grid_size(int64_t n, int threads) {
  const int64_t cap = static_cast<int64_t>(cuda_context().sm_count) * 32;
  return static_cast<unsigned>(std::clamp<int64_t>((n + threads - 1) / threads, 1, cap));
}

}  // namespace trainer::cuda
