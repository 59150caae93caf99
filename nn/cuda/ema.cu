// The exponential moving average of a model's weights (timm's ModelEmaV3 update) as one multi-tensor
// kernel: every floating tensor of the model in one launch (up to kEmaTensors per launch), then one
// small kernel that copies the integer buffers and advances the count of applied updates. Nothing is
// decided on the host: the decay comes from the device count (its warm-up), the skip from the loss
// scaler's flag and the every-N-steps verdict from a staged gate, so a CUDA graph replays it as is.
#include "nn/cuda/kernels.cuh"
#include "nn/kernel_checks.h"
#include "nn/optim/update_rules.h"

namespace trainer {
namespace cuda {
namespace {

// As the SGD kernel's launch (optim.cu): the tensors by value in the kernel's arguments, so a captured
// launch keeps them; each block updates one chunk of one tensor.
constexpr int kEmaTensors = 48;
constexpr int64_t kEmaChunk = 16384;
template <class T>
struct EmaLaunch {
  int tensors = 0;
  T* avg[kEmaTensors];
  const T* val[kEmaTensors];
  int64_t numel[kEmaTensors];
  bool copy[kEmaTensors];
  int chunk_start[kEmaTensors + 1];
};

struct EmaGates {
  const int64_t* skip;  // the loss scaler's found-inf flag, or null
  const int64_t* gate;  // zero: not this step; null: every step
  __device__ bool closed() const { return (skip && *skip != 0) || (gate && *gate == 0); }
};

// torch.lerp's two-sided formula.
template <class T>
__device__ __forceinline__ T lerp_value(T self, T end, T weight) {
  return weight < T(0.5) ? self + weight * (end - self) : end - (end - self) * (T(1) - weight);
}

template <class T>
__global__ void ema_float_kernel(EmaLaunch<T> l, const int64_t* count, EmaRule rule, EmaGates gates) {
  __shared__ T s_weight;
  __shared__ bool s_closed;
  if (threadIdx.x == 0) {  // the pow() of the warm-up once per block
    s_closed = gates.closed();
    s_weight = static_cast<T>(1.0 - ema_decay(rule, (*count + 1) * rule.every_steps));
  }
  __syncthreads();
  if (s_closed) return;
  int t = 0;
  while (t + 1 < l.tensors && l.chunk_start[t + 1] <= static_cast<int>(blockIdx.x)) ++t;
  T* a = l.avg[t];
  const T* v = l.val[t];
  const int64_t begin = (blockIdx.x - l.chunk_start[t]) * kEmaChunk;
  const int64_t end = begin + kEmaChunk < l.numel[t] ? begin + kEmaChunk : l.numel[t];
  const T weight = s_weight;
  if (l.copy[t]) {
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) a[i] = v[i];
  } else {
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) a[i] = lerp_value(a[i], v[i], weight);
  }
}

template <class T>
void launch_float(EmaLaunch<T>& l, const Tensor& updates, const EmaParams& p) {
  if (l.tensors == 0) return;
  ema_float_kernel<T><<<l.chunk_start[l.tensors], 256, 0, cuda_stream()>>>(
      l, static_cast<const int64_t*>(updates.raw_data()), p.rule, EmaGates{p.skip_if, p.gate});
  CUDA_CHECK_LAUNCH();
  l.tensors = 0;
  l.chunk_start[0] = 0;
}

// Integer buffers (BatchNorm's num_batches_tracked) are copied, as ModelEmaV3 copies them.
constexpr int kEmaInts = 64;
struct IntLaunch {
  int tensors = 0;
  int64_t* avg[kEmaInts];
  const int64_t* val[kEmaInts];
  int64_t numel[kEmaInts];
};

// Runs after every float launch of the update: copies, then (the last launch) counts the update.
__global__ void ema_int_kernel(IntLaunch l, int64_t* count, EmaGates gates) {
  if (gates.closed()) return;
  for (int t = 0; t < l.tensors; ++t)
    for (int64_t i = threadIdx.x; i < l.numel[t]; i += blockDim.x) l.avg[t][i] = l.val[t][i];
  if (count && threadIdx.x == 0) ++*count;
}

void launch_int(IntLaunch& l, int64_t* count, const EmaParams& p) {
  ema_int_kernel<<<1, 256, 0, cuda_stream()>>>(l, count, EmaGates{p.skip_if, p.gate});
  CUDA_CHECK_LAUNCH();
  l.tensors = 0;
}

template <class T>
void update_floats(const std::vector<Backend::EmaPair>& pairs, DType dtype, const Tensor& updates,
                   const EmaParams& p) {
  EmaLaunch<T> l;
  l.chunk_start[0] = 0;
  for (const Backend::EmaPair& pair : pairs) {
    const int64_t n = pair.average->numel();
    if (pair.average->dtype() != dtype || n == 0) continue;
    const int k = l.tensors++;
    l.avg[k] = static_cast<T*>(pair.average->raw_data());
    l.val[k] = static_cast<const T*>(pair.value->raw_data());
    l.numel[k] = n;
    l.copy[k] = pair.copy;
    l.chunk_start[k + 1] = l.chunk_start[k] + static_cast<int>((n + kEmaChunk - 1) / kEmaChunk);
    if (l.tensors == kEmaTensors) launch_float(l, updates, p);
  }
  launch_float(l, updates, p);
}

}  // namespace
}  // namespace cuda

void CudaBackend::ema_update(const std::vector<EmaPair>& pairs, Tensor& updates, const EmaParams& p) {
  using namespace cuda;
  check_ema_update(pairs, updates, updates.device());
  check_device(updates, "ema_update", "updates");
  update_floats<float>(pairs, DType::f32, updates, p);
  update_floats<double>(pairs, DType::f64, updates, p);
  IntLaunch ints;
  for (const EmaPair& pair : pairs) {
    if (pair.average->dtype() != DType::i64 || pair.average->numel() == 0) continue;
    const int k = ints.tensors++;
    ints.avg[k] = static_cast<int64_t*>(pair.average->raw_data());
    ints.val[k] = static_cast<const int64_t*>(pair.value->raw_data());
    ints.numel[k] = pair.average->numel();
    if (ints.tensors == kEmaInts) launch_int(ints, nullptr, p);
  }
  launch_int(ints, static_cast<int64_t*>(updates.raw_data()), p);
}

}  // namespace trainer
