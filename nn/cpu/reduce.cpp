// Sums over dimensions, materialised broadcasts and the finiteness check.
#include <algorithm>
#include <cmath>

#include "nn/cpu/cpu_backend.h"
#include "nn/cpu/strided.h"

namespace trainer {

Tensor CpuBackend::sum(const Tensor& a, const std::vector<int>& dims_in, bool keepdim) {
  const int nd = a.dim();
  std::vector<bool> reduce(nd, dims_in.empty());
  for (int d : dims_in) {
    const int dd = d < 0 ? d + nd : d;
    if (dd < 0 || dd >= nd) throw std::invalid_argument("sum: dim out of range for " + shape_str(a.shape()));
    reduce[dd] = true;
  }
  Shape kept(nd);
  for (int d = 0; d < nd; ++d) kept[d] = reduce[d] ? 1 : a.shape()[d];
  Tensor out = Tensor::zeros(kept, a.dtype());
  // Accumulate in double for both dtypes so f32 sums over large batches stay accurate.
  std::vector<double> acc(static_cast<size_t>(out.numel()), 0.0);
  Shape out_strides = contiguous_strides(kept);
  for (int d = 0; d < nd; ++d)
    if (reduce[d]) out_strides[d] = 0;
  TRAINER_DISPATCH_FLOAT(a.dtype(), "sum", [&] {
    const scalar_t* p = a.data<scalar_t>();
    // Fast path: a contiguous input whose kept dims form one block [k0, k1), e.g. the bias gradient
    // of a convolution (reduce N, H, W of NCHW) or of a linear layer (reduce N), or a full sum.
    int k0 = 0, k1 = nd;
    while (k0 < nd && reduce[k0]) ++k0;
    while (k1 > k0 && reduce[k1 - 1]) --k1;
    bool block = a.is_contiguous();
    for (int d = k0; d < k1 && block; ++d) block = !reduce[d];
    if (block) {
      int64_t outer = 1, mid = 1, inner = 1;
      for (int d = 0; d < k0; ++d) outer *= a.shape()[d];
      for (int d = k0; d < k1; ++d) mid *= a.shape()[d];
      for (int d = k1; d < nd; ++d) inner *= a.shape()[d];
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t m = 0; m < mid; ++m) {
          const scalar_t* row = p + (o * mid + m) * inner;
          double s = 0;
          for (int64_t i = 0; i < inner; ++i) s += row[i];
          acc[m] += s;
        }
    } else {
      cpu::for_each_index<2>(a.shape(), {a.strides(), out_strides},
                             [&](int64_t ia, int64_t io) { acc[io] += p[ia]; });
    }
    scalar_t* o = out.data<scalar_t>();
    for (size_t i = 0; i < acc.size(); ++i) o[i] = static_cast<scalar_t>(acc[i]);
  });
  if (keepdim) return out;
  Shape squeezed;
  for (int d = 0; d < nd; ++d)
    if (!reduce[d]) squeezed.push_back(a.shape()[d]);
  return out.view(squeezed);
}

Tensor CpuBackend::broadcast_to(const Tensor& a, const Shape& shape) {
  if (a.dim() > static_cast<int>(shape.size()))
    throw std::invalid_argument("broadcast_to: " + shape_str(a.shape()) + " has more dims than " + shape_str(shape));
  Shape strides(shape.size(), 0);
  const size_t off = shape.size() - a.dim();
  for (int i = 0; i < a.dim(); ++i) {
    if (a.shape()[i] != 1 && a.shape()[i] != shape[off + i])
      throw std::invalid_argument("broadcast_to: cannot broadcast " + shape_str(a.shape()) + " to " + shape_str(shape));
    strides[off + i] = a.shape()[i] == 1 ? 0 : a.strides()[i];
  }
  Tensor out = Tensor::empty(shape, a.dtype());
  TRAINER_DISPATCH_FLOAT(a.dtype(), "broadcast_to", [&] {
    const scalar_t* p = a.data<scalar_t>();
    scalar_t* o = out.data<scalar_t>();
    int64_t i = 0;
    cpu::for_each_index<1>(shape, {strides}, [&](int64_t ia) { o[i++] = p[ia]; });
  });
  return out;
}

bool CpuBackend::all_finite(const Tensor& a) {
  Tensor c = a.contiguous();
  return TRAINER_DISPATCH_FLOAT(a.dtype(), "all_finite", [&] {
    const scalar_t* p = c.data<scalar_t>();
    for (int64_t i = 0; i < c.numel(); ++i)
      if (!std::isfinite(p[i])) return false;
    return true;
  });
}

}  // namespace trainer
