// Global gradient norms on the GPU: Backend::add_squared_norms (LAMB's clipping) and clip_by_total_norm
// (optim.clip_grad_norm). The squares are summed in f64 by multi-tensor launches (multi_tensor.cuh)
// whose blocks each write one partial sum, a block's reduction having a fixed shape; then one block adds
// the partials in index order. The same bits on every run and GPU (an atomic add of each block's sum
// would depend on which block finishes first), and nothing is read on the host, so a CUDA graph
// captures the clipping with the step. f32 and f64, like the optimizers.
#include <algorithm>
#include <utility>
#include <vector>

#include "nn/cuda/kernels.cuh"
#include "nn/cuda/multi_tensor.cuh"
#include "nn/kernel_checks.h"

namespace trainer {
namespace cuda {
namespace {

constexpr int kNormTensors = 48;
constexpr int64_t kNormChunk = 16384;  // elements per block
constexpr int kNormThreads = 256;

template <class T>
struct NormLaunch {
  int tensors = 0;
  T* x[kNormTensors];
  int64_t numel[kNormTensors];
  int chunk_start[kNormTensors + 1] = {0};
};

template <class T>
__global__ void squared_norm_partials_kernel(NormLaunch<T> l, double* partials) {
  const auto [t, begin, end] = block_chunk(l, kNormChunk);
  const T* x = l.x[t];
  double s = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double v = static_cast<double>(x[i]);
    s += v * v;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// One block adds the n partials in a fixed order. Without `coefficient`: out[0] += the sum. With it:
// out[0] = the norm and coefficient[0] = max_norm / (norm + 1e-6), torch's clip coefficient.
__global__ void finish_norm_kernel(const double* partials, int64_t n, double* out, double max_norm,
                                   double* coefficient) {
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += partials[i];
  s = block_sum(s);
  if (threadIdx.x != 0) return;
  if (!coefficient) {
    out[0] += s;
    return;
  }
  const double norm = sqrt(s);
  out[0] = norm;
  coefficient[0] = max_norm / (norm + 1e-6);
}

// x *= min(coefficient, 1) in x's dtype; nothing where it is 1 or more (a NaN coefficient multiplies).
template <class T>
__global__ void scale_by_coefficient_kernel(NormLaunch<T> l, const double* coefficient) {
  const double c = *coefficient;
  if (c >= 1.0) return;
  const auto [t, begin, end] = block_chunk(l, kNormChunk);
  T* x = l.x[t];
  const T factor = static_cast<T>(c);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) x[i] *= factor;
}

int64_t chunks_of(int64_t numel) { return (numel + kNormChunk - 1) / kNormChunk; }

// Calls launch(l) for each run of up to kNormTensors non-empty tensors of element type T, in order.
template <class T, class F>
void for_each_launch(const std::vector<const Tensor*>& tensors, F&& launch) {
  NormLaunch<T> l;
  for (const Tensor* t : tensors) {
    if (t->dtype() != DTypeOf<T>::value || t->numel() == 0) continue;
    if (l.tensors == kNormTensors) {
      launch(l);
      l = NormLaunch<T>{};
    }
    const int k = l.tensors++;
    l.x[k] = static_cast<T*>(const_cast<void*>(t->raw_data()));
    l.numel[k] = t->numel();
    l.chunk_start[k + 1] = l.chunk_start[k] + static_cast<int>(chunks_of(t->numel()));
  }
  if (l.tensors > 0) launch(l);
}

// The squared sums of `tensors` (dense; f32 ones first, then f64) into one partial per chunk, and
// their count.
std::pair<Tensor, int64_t> squared_norm_partials(const std::vector<const Tensor*>& tensors) {
  int64_t chunks = 0;
  for (const Tensor* t : tensors) chunks += chunks_of(t->numel());
  Tensor partials = empty({std::max<int64_t>(chunks, 1)}, DType::f64);
  double* out = static_cast<double*>(partials.raw_data());
  auto run = [&](auto element) {
    using T = decltype(element);
    for_each_launch<T>(tensors, [&](const NormLaunch<T>& l) {
      squared_norm_partials_kernel<T><<<l.chunk_start[l.tensors], kNormThreads, 0, cuda_stream()>>>(l, out);
      CUDA_CHECK_LAUNCH();
      out += l.chunk_start[l.tensors];
    });
  };
  run(float{});
  run(double{});
  return {partials, chunks};
}

}  // namespace
}  // namespace cuda

void CudaBackend::add_squared_norms(const std::vector<const Tensor*>& tensors, Tensor& out) {
  using namespace cuda;
  check_squared_norms(tensors, out, out.device());
  check_device(out, "add_squared_norms", "out");
  std::vector<Tensor> dense_copies;  // kept until the kernels are queued
  std::vector<const Tensor*> dense;
  for (const Tensor* t : tensors) {
    if (is_dense(*t)) {
      dense.push_back(t);
      continue;
    }
    dense_copies.push_back(t->contiguous());
  }
  for (const Tensor& t : dense_copies) dense.push_back(&t);
  const auto [partials, n] = squared_norm_partials(dense);
  finish_norm_kernel<<<1, kNormThreads, 0, cuda_stream()>>>(
      static_cast<const double*>(partials.raw_data()), n, static_cast<double*>(out.raw_data()), 0.0, nullptr);
  CUDA_CHECK_LAUNCH();
}

void CudaBackend::clip_by_total_norm(const std::vector<Tensor*>& tensors, double max_norm, Tensor& norm_out) {
  using namespace cuda;
  check_device(norm_out, "clip_by_total_norm", "norm_out");
  check_clip_by_total_norm(tensors, max_norm, norm_out, norm_out.device());
  const std::vector<const Tensor*> in(tensors.begin(), tensors.end());
  const auto [partials, n] = squared_norm_partials(in);
  Tensor coefficient = empty({1}, DType::f64);
  const double* c = static_cast<const double*>(coefficient.raw_data());
  finish_norm_kernel<<<1, kNormThreads, 0, cuda_stream()>>>(
      static_cast<const double*>(partials.raw_data()), n, static_cast<double*>(norm_out.raw_data()), max_norm,
      static_cast<double*>(coefficient.raw_data()));
  CUDA_CHECK_LAUNCH();
  auto scale = [&](auto element) {
    using T = decltype(element);
    for_each_launch<T>(in, [&](const NormLaunch<T>& l) {
      scale_by_coefficient_kernel<T><<<l.chunk_start[l.tensors], kNormThreads, 0, cuda_stream()>>>(l, c);
      CUDA_CHECK_LAUNCH();
    });
  };
  scale(float{});
  scale(double{});
}

}  // namespace trainer
