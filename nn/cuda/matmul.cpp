// 2-D matrix products through cublasGemmEx, batched ones through cublasGemmStridedBatchedEx. Host code only
// (no kernels), so a .cpp file: nvcc has nothing to add here. Row-major operands are handed to column-major
// cuBLAS as their transposes (C^T = op(B)^T op(A)^T); transposed views are read in place instead of being
// copied.
#include <climits>

#include "nn/cuda/cuda_common.h"
#include "nn/kernel_checks.h"

namespace trainer {
namespace {

// A 2-D tensor as cuBLAS sees it: column-major storage with leading dimension ld. Row-major storage
// (stride(1) == 1) is the column-major transpose; column-major storage (stride(0) == 1) is itself.
struct GemmOperand {
  const void* ptr = nullptr;
  int64_t ld = 1;
  bool col_major = false;
  Tensor keep;  // a contiguous copy when the tensor had neither layout
};

GemmOperand gemm_operand(const Tensor& t) {
  const int64_t r = t.size(0), c = t.size(1), s0 = t.stride(0), s1 = t.stride(1);
  if ((c == 1 || s1 == 1) && (r == 1 || s0 >= std::max<int64_t>(c, 1)))
    return {t.raw_data(), r == 1 ? std::max<int64_t>(c, 1) : s0, false, Tensor()};
  if ((r == 1 || s0 == 1) && (c == 1 || s1 >= std::max<int64_t>(r, 1)))
    return {t.raw_data(), c == 1 ? std::max<int64_t>(r, 1) : s1, true, Tensor()};
  Tensor copy = t.contiguous();
  return {copy.raw_data(), std::max<int64_t>(c, 1), false, copy};
}

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::f64:
      return CUDA_R_64F;
    case DType::f16:
      return CUDA_R_16F;
    case DType::bf16:
      return CUDA_R_16BF;
    default:
      throw std::invalid_argument("matmul: needs f32, f64, f16 or bf16, got " +
                                  std::string(dtype_name(dtype)));
  }
}

int to_int(int64_t v, const char* what) {
  if (v > INT_MAX)
    throw std::invalid_argument(std::string("matmul: ") + what + " exceeds cuBLAS's int range");
  return static_cast<int>(v);
}

}  // namespace

Tensor CudaBackend::matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  using namespace cuda;
  check_device(a, "matmul", "lhs");
  check_device(b, "matmul", "rhs");
  if (a.dim() != 2 || b.dim() != 2)
    throw std::invalid_argument("matmul: expects 2-D tensors, got " + shape_str(a.shape()) + " and " +
                                shape_str(b.shape()));
  if (a.dtype() != b.dtype()) throw std::invalid_argument("matmul: dtype mismatch");
  const cudaDataType_t type = cuda_type(a.dtype());
  const int64_t m = trans_a ? a.size(1) : a.size(0);
  const int64_t k = trans_a ? a.size(0) : a.size(1);
  const int64_t kb = trans_b ? b.size(1) : b.size(0);
  const int64_t n = trans_b ? b.size(0) : b.size(1);
  if (k != kb)
    throw std::invalid_argument("matmul: inner dimensions differ: " + shape_str(a.shape()) +
                                (trans_a ? "^T" : "") + " @ " + shape_str(b.shape()) + (trans_b ? "^T" : ""));
  Tensor out = empty({m, n}, a.dtype());
  if (m == 0 || n == 0) return out;
  if (k == 0) {
    out.zero_();
    return out;
  }
  const GemmOperand A = gemm_operand(a), B = gemm_operand(b);
  // cuBLAS computes C^T [n, m] = op_b(B view) [n, k] @ op_a(A view) [k, m].
  const cublasOperation_t op_b = (trans_b != B.col_major) ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = (trans_a != A.col_major) ? CUBLAS_OP_T : CUBLAS_OP_N;
  CudaContext& ctx = cuda_context();
  cuda_stream();
  const float alpha_f = 1.0f, beta_f = 0.0f;
  const double alpha_d = 1.0, beta_d = 0.0;
  const bool f64 = a.dtype() == DType::f64;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  if (f64) compute = CUBLAS_COMPUTE_64F;
  if (a.dtype() == DType::f32 && cuda_allow_tf32()) compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  CUBLAS_CHECK(cublasGemmEx(ctx.cublas, op_b, op_a, to_int(n, "n"), to_int(m, "m"), to_int(k, "k"),
                            f64 ? static_cast<const void*>(&alpha_d) : &alpha_f, B.ptr, type,
                            to_int(B.ld, "ld"), A.ptr, type, to_int(A.ld, "ld"),
                            f64 ? static_cast<const void*>(&beta_d) : &beta_f, out.raw_data(), type,
                            to_int(n, "n"), compute, CUBLAS_GEMM_DEFAULT));
  return out;
}

Tensor CudaBackend::bmm(const Tensor& a_in, const Tensor& b_in, bool trans_a, bool trans_b) {
  using namespace cuda;
  check_device(a_in, "bmm", "lhs");
  check_device(b_in, "bmm", "rhs");
  const BmmSizes s = check_bmm(a_in, b_in, trans_a, trans_b, "bmm");
  const cudaDataType_t type = cuda_type(a_in.dtype());
  Tensor out = empty({s.batch, s.m, s.n}, a_in.dtype());
  if (out.numel() == 0) return out;
  if (s.k == 0) {
    out.zero_();
    return out;
  }
  // Each operand in place when its matrices are row- or column-major (a permuted view), else a copy.
  auto operand = [](const Tensor& t) {
    if (auto layout = batched_matrix_layout(t)) return std::make_pair(t, *layout);
    Tensor copy = t.contiguous();
    return std::make_pair(copy, *batched_matrix_layout(copy));
  };
  const auto [a, la] = operand(a_in);
  const auto [b, lb] = operand(b_in);
  // As matmul: cuBLAS computes C^T [n, m] = op_b(B) [n, k] @ op_a(A) [k, m] for each matrix, where a
  // row-major matrix is the column-major transpose.
  const cublasOperation_t op_b = (trans_b == lb.row_major) ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = (trans_a == la.row_major) ? CUBLAS_OP_T : CUBLAS_OP_N;
  CudaContext& ctx = cuda_context();
  cuda_stream();
  const float alpha_f = 1.0f, beta_f = 0.0f;
  const double alpha_d = 1.0, beta_d = 0.0;
  const bool f64 = a.dtype() == DType::f64;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;  // f32 accumulation for the half dtypes too
  if (f64) compute = CUBLAS_COMPUTE_64F;
  if (a.dtype() == DType::f32 && cuda_allow_tf32()) compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      ctx.cublas, op_b, op_a, to_int(s.n, "n"), to_int(s.m, "m"), to_int(s.k, "k"),
      f64 ? static_cast<const void*>(&alpha_d) : &alpha_f, b.raw_data(), type, to_int(lb.ld, "ld"),
      static_cast<long long>(lb.batch_stride), a.raw_data(), type, to_int(la.ld, "ld"),
      static_cast<long long>(la.batch_stride), f64 ? static_cast<const void*>(&beta_d) : &beta_f,
      out.raw_data(), type, to_int(s.n, "n"), static_cast<long long>(s.m * s.n), to_int(s.batch, "batch"),
      compute, CUBLAS_GEMM_DEFAULT));
  return out;
}

}  // namespace trainer
