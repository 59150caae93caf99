// The per-process CUDA context (device, compute stream, cuBLAS and cuDNN handles), the check
// functions behind CUDA_CHECK & co., and backend registration.
#include <cstring>
#include <mutex>
#include <string>

#include "nn/allocator.h"
#include "nn/cuda/caching_allocator.h"
#include "nn/cuda/cuda_backend.h"
#include "nn/cuda/cudnn_switches.h"

namespace trainer {
namespace {

CudaContext g_context;
bool g_initialised = false;
std::mutex g_init_mutex;
thread_local int t_current_device = -1;

// "nn/cuda/conv.cpp:12" rather than the build machine's absolute path.
std::string where(const char* file, int line) {
  std::string f = file;
  const size_t pos = f.rfind("/nn/");
  if (pos != std::string::npos) f = f.substr(pos + 1);
  return f + ":" + std::to_string(line);
}

std::string cuda_hint(cudaError_t status) {
  switch (status) {
    case cudaErrorMemoryAllocation:
      return "the GPU is out of memory: lower data.batch_size, use precision = \"bf16\", or check nvidia-smi "
             "for other processes on this GPU";
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
      return "no usable GPU: check nvidia-smi and CUDA_VISIBLE_DEVICES, or set train.device = \"cpu\"";
    case cudaErrorInsufficientDriver:
      return "the NVIDIA driver is older than this build's CUDA runtime: update the driver";
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
      return "a kernel faulted; rebuild with -DTRAINER_CUDA_DEBUG=ON so the error names the kernel, and run "
             "under compute-sanitizer";
    case cudaErrorNoKernelImageForDevice:
      return "this binary has no kernels for this GPU: rebuild with -DTRAINER_CUDA_ARCHS set to its compute "
             "capability";
    default:
      return "";
  }
}

[[noreturn]] void fail(const std::string& what, const char* call, const char* file, int line,
                       const std::string& hint) {
  std::string msg = what + " at " + where(file, line) + " in " + call;
  if (!hint.empty()) msg += ". HINT: " + hint;
  throw std::runtime_error(msg);
}

}  // namespace

void cuda_check(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  cudaGetLastError();  // clear a sticky-free error so later calls are not blamed for it
  fail(std::string("CUDA error ") + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")", call,
       file, line, cuda_hint(status));
}

void cublas_check(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  std::string hint;
  if (status == CUBLAS_STATUS_ALLOC_FAILED) hint = "the GPU is out of memory: lower data.batch_size";
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_ARCH_MISMATCH)
    hint = "this dtype is not supported by cuBLAS on this GPU: try precision = \"fp32\"";
  fail(
      std::string("cuBLAS error ") + cublasGetStatusName(status) + " (" + cublasGetStatusString(status) + ")",
      call, file, line, hint);
}

void cudnn_check(cudnnStatus_t status, const char* call, const char* file, int line) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  std::string hint;
  if (status / 1000 == CUDNN_STATUS_NOT_SUPPORTED / 1000)
    hint =
        "cuDNN has no kernel for this dtype/layout/shape: try precision = \"fp32\" or channels_last = false";
  if (status == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
    hint = "the GPU is out of memory: lower data.batch_size";
  if (status == CUDNN_STATUS_NOT_INITIALIZED || status == CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED ||
      status == CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH)
    hint = "cuDNN did not load: source the bundle's env.sh so that libcudnn*.so.9 is on LD_LIBRARY_PATH";
  fail(std::string("cuDNN error ") + cudnnGetErrorString(status), call, file, line, hint);
}

void cuda_check_launch(const char* file, int line) {
  cuda_check(cudaGetLastError(), "kernel launch", file, line);
#ifdef TRAINER_CUDA_DEBUG
  cuda_check(cudaStreamSynchronize(g_context.stream), "kernel (TRAINER_CUDA_DEBUG sync)", file, line);
#endif
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

CudaContext& cuda_context() {
  if (!g_initialised)
    throw std::logic_error("the CUDA backend is not initialised: call init_cuda_backend(LOCAL_RANK) first");
  return g_context;
}

cudaStream_t cuda_stream() {
  CudaContext& ctx = cuda_context();
  if (t_current_device != ctx.device) {
    CUDA_CHECK(cudaSetDevice(ctx.device));
    t_current_device = ctx.device;
  }
  return ctx.stream;
}

void cuda_synchronize() { CUDA_CHECK(cudaStreamSynchronize(cuda_stream())); }

bool cuda_stream_capturing() {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(cuda_stream(), &status));
  return status != cudaStreamCaptureStatusNone;
}

const runtime::BackendOptions& cuda_options() { return g_context.options; }
void cuda_set_options(const runtime::BackendOptions& options) { g_context.options = options; }
bool cuda_allow_tf32() { return g_context.options.allow_tf32; }
bool cuda_deterministic() { return g_context.options.deterministic; }

void init_cuda_backend(int device_index) {
  std::lock_guard<std::mutex> lock(g_init_mutex);
  const int count = cuda_device_count();
  if (device_index < 0 || device_index >= count) {
    const std::string hint =
        count == 0 ? "no GPU is visible to this process: check nvidia-smi and CUDA_VISIBLE_DEVICES, or set "
                     "train.device = \"cpu\""
                   : "start at most " + std::to_string(count) +
                         " processes on this node (--nproc-per-node), or check CUDA_VISIBLE_DEVICES";
    throw std::runtime_error("LOCAL_RANK " + std::to_string(device_index) + " asks for GPU " +
                             std::to_string(device_index) + " but only " + std::to_string(count) +
                             " are visible. HINT: " + hint);
  }
  if (g_initialised) {
    if (device_index == g_context.device) return;
    throw std::runtime_error("init_cuda_backend: this process already drives GPU " +
                             std::to_string(g_context.device) + " and cannot switch to GPU " +
                             std::to_string(device_index) + ". HINT: start one process per GPU");
  }
  CudaContext ctx;
  ctx.device = device_index;
  cudnn_switches();  // the environment is read here, at start-up, not inside the first step
  CUDA_CHECK(cudaSetDevice(device_index));
  t_current_device = device_index;
  CUDA_CHECK(cudaDeviceGetAttribute(&ctx.sm_count, cudaDevAttrMultiProcessorCount, device_index));
  // Non-blocking: the legacy default stream (used by any library call without a stream) must not
  // serialise against ours.
  CUDA_CHECK(cudaStreamCreateWithFlags(&ctx.stream, cudaStreamNonBlocking));
  CUBLAS_CHECK(cublasCreate(&ctx.cublas));
  CUBLAS_CHECK(cublasSetStream(ctx.cublas, ctx.stream));
  // f32 GEMMs choose their compute type per call (CUBLAS_COMPUTE_32F unless TF32 is allowed).
  CUBLAS_CHECK(cublasSetMathMode(ctx.cublas, CUBLAS_DEFAULT_MATH));
  // A workspace of our own (32 MiB, NVIDIA's figure for Hopper): otherwise cuBLAS allocates one on
  // first use per stream, which a CUDA graph capture (nn/cuda/cuda_graph.h) cannot do.
  constexpr size_t kCublasWorkspace = size_t{32} << 20;
  void* workspace = nullptr;
  CUDA_CHECK(cudaMalloc(&workspace, kCublasWorkspace));
  CUBLAS_CHECK(cublasSetWorkspace(ctx.cublas, workspace, kCublasWorkspace));
  ctx.gemm_workspace = workspace;
  ctx.gemm_workspace_bytes = kCublasWorkspace;
  CUBLAS_CHECK(cublasLtCreate(&ctx.cublas_lt));
  CUDNN_CHECK(cudnnCreate(&ctx.cudnn));
  CUDNN_CHECK(cudnnSetStream(ctx.cudnn, ctx.stream));
  ctx.options = g_context.options;  // set before the device was (tests, benchmarks)
  g_context = ctx;
  g_initialised = true;
  // Leaked on purpose: tensors in static storage may be freed after main returns.
  static CudaBackend* backend = new CudaBackend();
  register_allocator(DeviceKind::cuda, &cuda::caching_allocator());
  register_backend(DeviceKind::cuda, backend);
}

}  // namespace trainer
