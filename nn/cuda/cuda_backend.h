#pragma once
// The CUDA backend: every Backend kernel on one GPU, on that device's compute stream. cuDNN for
// convolutions, cuBLAS for matmul, own kernels (one op family per .cu file in nn/cuda/) for the rest.
// Memory comes from the caching allocator (nn/cuda/caching_allocator.h). This header is plain C++ plus
// the CUDA, cuBLAS and cuDNN headers, so .cu and .cpp files both include it.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <stdexcept>
#include <string>

#include "nn/backend.h"
#include "nn/backend_overrides.h"
#include "nn/runtime.h"

namespace trainer {

// Per-process CUDA state for the one device this process uses.
struct CudaContext {
  int device = -1;
  cudaStream_t stream = nullptr;  // the compute stream every kernel runs on
  cublasHandle_t cublas = nullptr;
  cublasLtHandle_t cublas_lt = nullptr;  // GEMMs with epilogues (nn/cuda/linear_lt.cpp)
  // cuBLAS's workspace, shared with cuBLASLt: both run on `stream`, one call after another.
  void* gemm_workspace = nullptr;
  size_t gemm_workspace_bytes = 0;
  cudnnHandle_t cudnn = nullptr;
  int sm_count = 1;  // multiprocessors, for sizing grid-stride launches
  // The kernel choices (TF32, determinism, cuDNN's fused paths), set by runtime::apply_backend_options;
  // kept across init_cuda_backend.
  runtime::BackendOptions options;
};

// The context; throws if init_cuda_backend() has not run.
CudaContext& cuda_context();

// Selects the GPU `device_index` (LOCAL_RANK), creates its stream and library handles and registers
// the CUDA allocator and backend. Throws, with a HINT, when there is no such device.
void init_cuda_backend(int device_index);
// Number of visible CUDA devices (0 when there is no driver or no device; never throws).
int cuda_device_count();
// The compute stream, with the context's device made current on the calling thread (worker threads
// start on device 0, so every entry point goes through this).
cudaStream_t cuda_stream();
// Waits for everything queued on the compute stream.
void cuda_synchronize();
// Whether the compute stream is recording a CUDA graph (then nothing may be timed or read back).
bool cuda_stream_capturing();
// The backend's options (runtime::BackendOptions); readable before init_cuda_backend.
const runtime::BackendOptions& cuda_options();
void cuda_set_options(const runtime::BackendOptions& options);
// TF32 tensor-core math for f32 matmul and convolution (precision = "tf32"). Off by default: f32
// results then match the CPU to ~1e-5 relative.
bool cuda_allow_tf32();
// Bitwise reproducible results across runs and processes (train.deterministic), like PyTorch's
// torch.use_deterministic_algorithms + cudnn.deterministic: convolutions use only engines cuDNN marks
// deterministic, chosen by cuDNN's heuristic order instead of by timing (timings differ between runs,
// and so would the algorithm and its rounding); max-pool backward accumulates exactly. Costs speed.
bool cuda_deterministic();
// One line on how the convolutions seen so far run (graph-API plans, legacy algorithms, workspace).
std::string cuda_conv_summary();

// Throws std::runtime_error naming file:line, the call and the CUDA error, when `status` is an error.
void cuda_check(cudaError_t status, const char* call, const char* file, int line);
void cublas_check(cublasStatus_t status, const char* call, const char* file, int line);
void cudnn_check(cudnnStatus_t status, const char* call, const char* file, int line);
#define CUDA_CHECK(call) ::trainer::cuda_check((call), #call, __FILE__, __LINE__)
#define CUBLAS_CHECK(call) ::trainer::cublas_check((call), #call, __FILE__, __LINE__)
#define CUDNN_CHECK(call) ::trainer::cudnn_check((call), #call, __FILE__, __LINE__)
// After a kernel launch: checks the launch, and in debug builds (TRAINER_CUDA_DEBUG) synchronises
// so that an asynchronous fault is reported at the kernel that caused it.
#define CUDA_CHECK_LAUNCH() ::trainer::cuda_check_launch(__FILE__, __LINE__)
void cuda_check_launch(const char* file, int line);

class CudaBackend final : public Backend {
 public:
  TRAINER_BACKEND_OVERRIDES
  void sgd_step_many(const std::vector<SgdUpdate>& updates, const SgdParams& p) override;
  void adamw_step_many(const std::vector<AdamWUpdate>& updates, const AdamWParams& p) override;
  std::optional<Tensor> linear_fused(const Tensor& x, const Tensor& w, const Tensor& bias) override;
  std::optional<std::pair<Tensor, Tensor>> linear_weight_grads_fused(const Tensor& g,
                                                                     const Tensor& x) override;
  std::optional<BnGrads> bn_backward_fused(const Tensor& grad_y, const Tensor& x, const Tensor& mean,
                                           const Tensor& invstd, const Tensor& gamma, const Tensor& beta,
                                           const Tensor& relu_out, double eps) override;
  std::optional<BnForward> bn_forward_fused(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                            Tensor& running_mean, Tensor& running_var, double momentum,
                                            double eps, const BnEpilogue& epilogue) override;
  std::optional<std::pair<Tensor, Tensor>> conv2d_weight_and_bias_grads_fused(const Tensor& grad_y,
                                                                              const Tensor& x,
                                                                              const Shape& w_shape,
                                                                              const Conv2dParams& p) override;
  std::optional<AddLayerNormForward> add_layer_norm(const Tensor& x, const Tensor& branch,
                                                    int64_t normalized_size, const Tensor& gamma,
                                                    const Tensor& beta, double eps, DType y_dtype) override;
  std::optional<AddLayerNormGrads> add_layer_norm_backward(const Tensor& grad_y, const Tensor& grad_h_in,
                                                           const Tensor& h, const Tensor& mean,
                                                           const Tensor& rstd, const Tensor& gamma,
                                                           DType branch_dtype) override;
  std::optional<Tensor> scaled_residual_add(const Tensor& x, const Tensor& h, const Tensor& scale,
                                            const Tensor& keep) override;
  std::optional<std::pair<Tensor, Tensor>> scaled_residual_add_backward(const Tensor& grad_y, const Tensor& h,
                                                                        const Tensor& scale,
                                                                        const Tensor& keep) override;
  std::optional<AttentionForward> fused_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                                  double scale) override;
  std::optional<AttentionGrads> fused_attention_backward(const Tensor& grad_out, const Tensor& q,
                                                         const Tensor& k, const Tensor& v, const Tensor& out,
                                                         const Tensor& stats, double scale) override;
};

}  // namespace trainer
