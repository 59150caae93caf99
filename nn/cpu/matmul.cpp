// 2-D and batched matrix products through OpenBLAS.
#include <cblas.h>

#include "nn/cpu/cpu_backend.h"
#include "nn/cpu/parallel.h"
#include "nn/kernel_checks.h"

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

namespace {

// OpenBLAS runs a GEMM of fewer multiply-adds than this on the calling thread (interface/gemm.c:
// SMP_THRESHOLD_MIN 65536 times GEMM_MULTITHREAD_THRESHOLD 4), so a batch of such matrices is split
// over our threads instead; larger ones run one after another, each on OpenBLAS's threads.
constexpr int64_t kBlasSingleThreadedBelow = 65536 * 4;

// A batch operand as row-major cblas reads it: a transposed view is the row-major transpose of its
// storage, so it is read in place with the transposition flipped.
struct CblasBatch {
  Tensor keep;  // the tensor read (a contiguous copy when it had neither layout)
  BatchedMatrixLayout layout;
};

CblasBatch cblas_batch(const Tensor& t) {
  if (auto layout = batched_matrix_layout(t)) return {t, *layout};
  Tensor copy = t.contiguous();
  return {copy, *batched_matrix_layout(copy)};
}

}  // namespace

Tensor CpuBackend::bmm(const Tensor& a_in, const Tensor& b_in, bool trans_a, bool trans_b) {
  const BmmSizes s = check_bmm(a_in, b_in, trans_a, trans_b, "bmm");
  if (a_in.dtype() != DType::f32 && a_in.dtype() != DType::f64)
    throw std::invalid_argument("bmm: the CPU backend computes in f32 or f64, got " +
                                std::string(dtype_name(a_in.dtype())));
  Tensor out = Tensor::empty({s.batch, s.m, s.n}, a_in.dtype());
  if (out.numel() == 0) return out;
  if (s.k == 0) {
    out.zero_();
    return out;
  }
  const CblasBatch a = cblas_batch(a_in), b = cblas_batch(b_in);
  const auto ta = (trans_a == a.layout.row_major) ? CblasTrans : CblasNoTrans;
  const auto tb = (trans_b == b.layout.row_major) ? CblasTrans : CblasNoTrans;
  const int64_t macs = s.m * s.n * s.k;
  auto run = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t ao = i * a.layout.batch_stride, bo = i * b.layout.batch_stride, oo = i * s.m * s.n;
      if (out.dtype() == DType::f32)
        cblas_sgemm(CblasRowMajor, ta, tb, s.m, s.n, s.k, 1.0f, a.keep.data<float>() + ao, a.layout.ld,
                    b.keep.data<float>() + bo, b.layout.ld, 0.0f, out.data<float>() + oo, s.n);
      else
        cblas_dgemm(CblasRowMajor, ta, tb, s.m, s.n, s.k, 1.0, a.keep.data<double>() + ao, a.layout.ld,
                    b.keep.data<double>() + bo, b.layout.ld, 0.0, out.data<double>() + oo, s.n);
    }
  };
  if (macs < kBlasSingleThreadedBelow)
    cpu::parallel_ranges(s.batch, s.batch * macs, run, 1);
  else
    run(0, s.batch);
  return out;
}

}  // namespace trainer
