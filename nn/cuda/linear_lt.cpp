// Linear layers through cuBLASLt: the forward GEMM adds the bias in its epilogue (BIAS) and the
// weight-gradient GEMM sums the bias gradient while it reads the output gradient (BGRADB). Without
// them a ViT-B/16 step at batch 128 spent 9.5 of 91 ms summing bias gradients and ~5 ms adding biases
// (H100 trace, bench/results/2026-12-07_h100_session16_vit_kernels.txt). Host code only, so a .cpp.
//
// Row-major operands are column-major transposes, as in nn/cuda/matmul.cpp:
//   forward  y^T [out, M] = (w as [in, out])^T @ (x as [in, M]);  bias [out] = D's rows
//   backward dW^T [in, out] = (x as [in, M]) @ (g as [out, M])^T;  db [out] = D's columns, summed over
//   k = M, which is BGRADB's reduction (the layout of apex's fused_dense).
// The algorithm comes from cuBLASLt's heuristic (no timing, so runs stay reproducible), cached per
// shape, dtype and operand alignment; where it has none the caller falls back to matmul + add/sum.
#include <climits>
#include <map>
#include <tuple>

#include "nn/cuda/cuda_common.h"

namespace trainer {
namespace {

std::optional<cudaDataType_t> lt_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::f16:
      return CUDA_R_16F;
    case DType::bf16:
      return CUDA_R_16BF;
    default:
      return std::nullopt;  // f64 and integers: matmul's path
  }
}

// The largest power of two up to 256 dividing the address: cuBLASLt's kernels need their operands
// aligned as the heuristic was told.
uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && address % a != 0) a /= 2;
  return a;
}

// One column-major GEMM D [m, n] = op_a(A) @ op_b(B) with an epilogue, as cuBLASLt is told it.
struct LtGemm {
  cublasOperation_t op_a = CUBLAS_OP_N, op_b = CUBLAS_OP_N;
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldd = 0;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  cudaDataType_t type = CUDA_R_32F;
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;
  void* bias = nullptr;  // read by BIAS, written by BGRADB
};

// The descriptors of one call; cheap to build (host only), so only the algorithm is cached.
struct LtDescriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  LtDescriptors() = default;
  LtDescriptors(const LtDescriptors&) = delete;
  LtDescriptors& operator=(const LtDescriptors&) = delete;
  ~LtDescriptors() {
    if (preference) cublasLtMatmulPreferenceDestroy(preference);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

template <typename T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const T& value) {
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)));
}

template <typename T>
void set_preference(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attribute,
                    const T& value) {
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, attribute, &value, sizeof(value)));
}

void describe(const LtGemm& g, LtDescriptors& s) {
  const bool tf32 = g.type == CUDA_R_32F && cuda_allow_tf32();
  CUBLAS_CHECK(
      cublasLtMatmulDescCreate(&s.op, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_desc(s.op, CUBLASLT_MATMUL_DESC_TRANSA, g.op_a);
  set_desc(s.op, CUBLASLT_MATMUL_DESC_TRANSB, g.op_b);
  set_desc(s.op, CUBLASLT_MATMUL_DESC_EPILOGUE, g.epilogue);
  set_desc(s.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
  // The stored matrices, before op_a / op_b.
  const bool ta = g.op_a == CUBLAS_OP_T, tb = g.op_b == CUBLAS_OP_T;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&s.a, g.type, ta ? g.k : g.m, ta ? g.m : g.k, g.lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&s.b, g.type, tb ? g.n : g.k, tb ? g.k : g.n, g.ldb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&s.d, g.type, g.m, g.n, g.ldd));
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&s.preference));
  set_preference(s.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, cuda_context().gemm_workspace_bytes);
  set_preference(s.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment_of(g.a));
  set_preference(s.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment_of(g.b));
  set_preference(s.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment_of(g.d));
  set_preference(s.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment_of(g.d));
}

// The heuristic's first algorithm for this call's shape, or nullopt when cuBLASLt has none (an
// epilogue it does not support for these types or transposes): remembered either way, in the cache
// entry returned, which run() clears when cuBLASLt then refuses the launch.
std::optional<cublasLtMatmulAlgo_t>& algorithm_for(const LtGemm& g, const LtDescriptors& s) {
  using Key = std::tuple<int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, uint32_t,
                         uint32_t, uint32_t, uint32_t, bool>;
  static std::map<Key, std::optional<cublasLtMatmulAlgo_t>> cache;
  const Key key{g.op_a,
                g.op_b,
                g.m,
                g.n,
                g.k,
                g.lda,
                g.ldb,
                g.ldd,
                static_cast<int>(g.epilogue),
                g.type,
                alignment_of(g.a),
                alignment_of(g.b),
                alignment_of(g.d),
                alignment_of(g.bias),
                cuda_allow_tf32()};
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(cuda_context().cublas_lt, s.op, s.a, s.b, s.d,
                                                               s.d, s.preference, 1, &result, &found);
  std::optional<cublasLtMatmulAlgo_t>& algo = cache[key];
  if (status == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS)
    algo = result.algo;
  return algo;
}

// Runs the GEMM; false (nothing queued) when cuBLASLt has no algorithm for it.
bool run(const LtGemm& g) {
  LtDescriptors s;
  describe(g, s);
  std::optional<cublasLtMatmulAlgo_t>& algo = algorithm_for(g, s);
  if (!algo) return false;
  const float alpha = 1.0f, beta = 0.0f;
  CudaContext& ctx = cuda_context();
  // A launch cuBLASLt refuses (NOT_SUPPORTED, INVALID_VALUE: a constraint the heuristic did not see)
  // queued nothing, so the caller's unfused path is still exact, and is not retried for this shape
  // (the cache forgets the algorithm); anything else is a real error.
  const cublasStatus_t status =
      cublasLtMatmul(ctx.cublas_lt, s.op, &alpha, g.a, s.a, g.b, s.b, &beta, g.d, s.d, g.d, s.d, &*algo,
                     ctx.gemm_workspace, ctx.gemm_workspace_bytes, cuda_stream());
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE) {
    algo.reset();
    return false;
  }
  CUBLAS_CHECK(status);
  return true;
}

// A row-major matrix cuBLASLt can read in place: unit stride along rows, leading dimension >= cols.
bool row_major(const Tensor& t) {
  return t.dim() == 2 && t.stride(1) == 1 && t.stride(0) >= t.size(1) && t.stride(0) <= INT_MAX;
}

bool fits_int(std::initializer_list<int64_t> sizes) {
  for (int64_t s : sizes)
    if (s <= 0 || s > INT_MAX) return false;
  return true;
}

}  // namespace

std::optional<Tensor> CudaBackend::linear_fused(const Tensor& x, const Tensor& w, const Tensor& bias) {
  using namespace cuda;
  const std::optional<cudaDataType_t> type = lt_type(x.dtype());
  if (!type || !bias.defined() || w.dtype() != x.dtype() || bias.dtype() != x.dtype() || !row_major(x) ||
      !row_major(w) || bias.dim() != 1 || bias.stride(0) != 1 || w.size(1) != x.size(1) ||
      bias.size(0) != w.size(0) || !fits_int({x.size(0), x.size(1), w.size(0)}) ||
      alignment_of(bias.raw_data()) < 16)  // the heuristic is not told the bias's alignment: keep it safe
    return std::nullopt;
  check_device(x, "linear", "input");
  check_device(w, "linear", "weight");
  check_device(bias, "linear", "bias");
  const int64_t rows = x.size(0), in = x.size(1), out = w.size(0);
  Tensor y = empty({rows, out}, x.dtype());  // [M, out]
  LtGemm g;
  g.op_a = CUBLAS_OP_T, g.op_b = CUBLAS_OP_N;
  g.m = out, g.n = rows, g.k = in;
  g.lda = w.stride(0), g.ldb = x.stride(0), g.ldd = out;
  g.epilogue = CUBLASLT_EPILOGUE_BIAS;
  g.type = *type;
  g.a = w.raw_data(), g.b = x.raw_data(), g.d = y.raw_data();
  g.bias = const_cast<void*>(bias.raw_data());  // read only (the BIAS epilogue)
  if (!run(g)) return std::nullopt;
  return y;
}

std::optional<std::pair<Tensor, Tensor>> CudaBackend::linear_weight_grads_fused(const Tensor& grad,
                                                                                const Tensor& x) {
  using namespace cuda;
  const std::optional<cudaDataType_t> type = lt_type(x.dtype());
  if (!type || grad.dtype() != x.dtype() || !row_major(grad) || !row_major(x) || grad.size(0) != x.size(0) ||
      !fits_int({x.size(0), x.size(1), grad.size(1)}))
    return std::nullopt;
  check_device(grad, "linear backward", "output gradient");
  check_device(x, "linear backward", "input");
  const int64_t rows = x.size(0), in = x.size(1), out = grad.size(1);
  Tensor dw = empty({out, in}, x.dtype());  // [out, in]
  Tensor db = empty({out}, x.dtype());
  LtGemm g;
  g.op_a = CUBLAS_OP_N, g.op_b = CUBLAS_OP_T;
  g.m = in, g.n = out, g.k = rows;
  g.lda = x.stride(0), g.ldb = grad.stride(0), g.ldd = in;
  g.epilogue = CUBLASLT_EPILOGUE_BGRADB;
  g.type = *type;
  g.a = x.raw_data(), g.b = grad.raw_data(), g.d = dw.raw_data(), g.bias = db.raw_data();
  if (!run(g)) return std::nullopt;
  return std::make_pair(dw, db);
}

}  // namespace trainer
