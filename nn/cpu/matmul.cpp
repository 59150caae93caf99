// 2-D matrix products through OpenBLAS.
#include <cblas.h>

#include "nn/cpu/cpu_backend.h"

namespace trainer {

Tensor CpuBackend::matmul(const Tensor& a_in, const Tensor& b_in, bool trans_a, bool trans_b) {
  if (a_in.dim() != 2 || b_in.dim() != 2)
    throw std::invalid_argument("matmul: expects 2-D tensors, got " + shape_str(a_in.shape()) + " and " +
                                shape_str(b_in.shape()));
  if (a_in.dtype() != b_in.dtype()) throw std::invalid_argument("matmul: dtype mismatch");
  const Tensor a = a_in.contiguous(), b = b_in.contiguous();
  const int64_t m = trans_a ? a.size(1) : a.size(0);
  const int64_t k = trans_a ? a.size(0) : a.size(1);
  const int64_t kb = trans_b ? b.size(1) : b.size(0);
  const int64_t n = trans_b ? b.size(0) : b.size(1);
  if (k != kb)
    throw std::invalid_argument("matmul: inner dimensions differ: " + shape_str(a.shape()) +
                                (trans_a ? "^T" : "") + " @ " + shape_str(b.shape()) + (trans_b ? "^T" : ""));
  Tensor out = Tensor::empty({m, n}, a.dtype());
  if (m == 0 || n == 0) return out;
  if (k == 0) {
    out.zero_();
    return out;
  }
  const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  if (a.dtype() == DType::f32) {
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, 1.0f, a.data<float>(), a.size(1), b.data<float>(), b.size(1),
                0.0f, out.data<float>(), n);
  } else if (a.dtype() == DType::f64) {
    cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, 1.0, a.data<double>(), a.size(1), b.data<double>(), b.size(1),
                0.0, out.data<double>(), n);
  } else {
    throw std::invalid_argument("matmul: the CPU backend computes in f32 or f64");
  }
  return out;
}

}  // namespace trainer
