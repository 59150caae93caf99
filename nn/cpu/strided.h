#pragma once
// Iteration over the elements of strided tensors in logical (row-major) order, for CPU kernels that
// must accept any layout. Hot kernels make their inputs contiguous instead.
#include <array>
#include <cstdint>
#include <tuple>
#include <vector>

#include "nn/tensor.h"

namespace trainer::cpu {

// Calls fn(offset_0, ..., offset_{K-1}) for every index of `shape`, where offset_k is the element
// offset of that index under strides[k]. Strides of 0 express broadcasting.
template <size_t K, class Fn>
void for_each_index(const Shape& shape, const std::array<Shape, K>& strides, Fn&& fn) {
  const int nd = static_cast<int>(shape.size());
  const int64_t total = shape_numel(shape);
  if (total == 0) return;
  std::vector<int64_t> index(nd, 0);
  std::array<int64_t, K> off{};
  for (int64_t n = 0; n < total; ++n) {
    std::apply(fn, off);
    for (int d = nd - 1; d >= 0; --d) {
      if (++index[d] < shape[d]) {
        for (size_t k = 0; k < K; ++k) off[k] += strides[k][d];
        break;
      }
      for (size_t k = 0; k < K; ++k) off[k] -= strides[k][d] * (shape[d] - 1);
      index[d] = 0;
    }
  }
}

}  // namespace trainer::cpu
