#pragma once
// Device-side building blocks of the CUDA backend's kernels: element types and their compute types,
// the floating dtype dispatch, strided offsets, grid-stride launches of device lambdas and
// block reductions. Included only by .cu files.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "nn/cuda/cuda_common.h"
#include "nn/dtype_dispatch.h"

namespace trainer::cuda {

// Compute type: half types compute in f32, f64 in f64.
template <class T>
struct Acc {
  using type = float;
};
template <>
struct Acc<double> {
  using type = double;
};
template <class T>
using acc_t = typename Acc<T>::type;

__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }
__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T>
__device__ __forceinline__ T from_acc(double v);
template <>
__device__ __forceinline__ float from_acc<float>(double v) {
  return static_cast<float>(v);
}
template <>
__device__ __forceinline__ double from_acc<double>(double v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_acc<__half>(double v) {
  return __float2half_rn(static_cast<float>(v));
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(double v) {
  return __float2bfloat16_rn(static_cast<float>(v));
}
// float overloads so that f32 compute never round-trips through double.
template <class T>
__device__ __forceinline__ T from_f(float v) {
  return from_acc<T>(v);
}
template <>
__device__ __forceinline__ float from_f<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_f<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <class T>
__device__ __forceinline__ T store(acc_t<T> v) {
  if constexpr (std::is_same_v<acc_t<T>, double>)
    return from_acc<T>(v);
  else
    return from_f<T>(v);
}

// Binds scalar_t to the element type of a floating dtype; other dtypes throw (nn/dtype_dispatch.h).
#define CUDA_DISPATCH_FLOAT(dtype, op_name, ...)                                                      \
  [&] {                                                                                               \
    switch (dtype) {                                                                                  \
      TRAINER_DTYPE_CASE(f32, float, __VA_ARGS__)                                                     \
      TRAINER_DTYPE_CASE(f64, double, __VA_ARGS__)                                                    \
      TRAINER_DTYPE_CASE(f16, __half, __VA_ARGS__)                                                    \
      TRAINER_DTYPE_CASE(bf16, __nv_bfloat16, __VA_ARGS__)                                            \
      TRAINER_DTYPE_UNSUPPORTED(dtype, op_name, "the CUDA backend computes in f32, f64, f16 or bf16") \
    }                                                                                                 \
  }()

// As above for the optimizer kernels, which keep to f32 and f64 like the CPU backend.
#define CUDA_DISPATCH_F32_F64(dtype, op_name, ...) \
  TRAINER_DISPATCH_F32_F64(dtype, op_name, "needs f32 or f64", __VA_ARGS__)

__device__ __forceinline__ int64_t offset_of(const Indexer& ix, int64_t i) {
  int64_t off = 0;
#pragma unroll
  for (int d = kMaxDims - 1; d >= 0; --d) {
    if (d < ix.nd) {
      const int64_t q = i / ix.size[d];
      off += (i - q * ix.size[d]) * ix.stride[d];
      i = q;
    }
  }
  return off;
}

template <class F>
__global__ void for_each_kernel(int64_t n, F f) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    f(i);
}

// Runs f(i) for i in [0, n) on the compute stream.
template <class F>
void for_each(int64_t n, F f) {
  if (n <= 0) return;
  constexpr int kThreads = 256;
  for_each_kernel<<<grid_size(n, kThreads), kThreads, 0, cuda_stream()>>>(n, f);
  CUDA_CHECK_LAUNCH();
}

// 16 bytes of T, for vectorised loads and stores.
template <class T>
struct alignas(16) Pack16 {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// out[i] = f(a[i], b[i], c[i]) over dense buffers in the compute type (a missing input reads as 0),
// 16 bytes at a time when every buffer is 16-byte aligned. out may be one of the inputs.
template <class T, class F>
__global__ void map_kernel(int64_t n, T* out, const T* a, const T* b, const T* c, bool vec, F f) {
  using acc = acc_t<T>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  int64_t done = 0;
  if (vec) {
    using P = Pack16<T>;
    constexpr int V = P::kSize;
    const int64_t nv = n / V;
    for (int64_t q = i; q < nv; q += stride) {
      P pa, pb, pc, r;
      if (a) pa = reinterpret_cast<const P*>(a)[q];
      if (b) pb = reinterpret_cast<const P*>(b)[q];
      if (c) pc = reinterpret_cast<const P*>(c)[q];
#pragma unroll
      for (int j = 0; j < V; ++j)
        r.v[j] = store<T>(
            f(a ? to_acc(pa.v[j]) : acc(0), b ? to_acc(pb.v[j]) : acc(0), c ? to_acc(pc.v[j]) : acc(0)));
      reinterpret_cast<P*>(out)[q] = r;
    }
    done = nv * V;
  }
  for (int64_t k = done + i; k < n; k += stride)
    out[k] = store<T>(f(a ? to_acc(a[k]) : acc(0), b ? to_acc(b[k]) : acc(0), c ? to_acc(c[k]) : acc(0)));
}

template <class T, class F>
void map(int64_t n, T* out, const T* a, const T* b, const T* c, F f) {
  if (n <= 0) return;
  constexpr int kThreads = 256;
  const bool vec = aligned16(out) && (!a || aligned16(a)) && (!b || aligned16(b)) && (!c || aligned16(c));
  const int64_t items = vec ? (n + Pack16<T>::kSize - 1) / Pack16<T>::kSize : n;
  map_kernel<<<grid_size(items, kThreads), kThreads, 0, cuda_stream()>>>(n, out, a, b, c, vec, f);
  CUDA_CHECK_LAUNCH();
}

template <class T, class Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
struct SumOp {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
template <class T>
__device__ __forceinline__ T warp_sum(T v) {
  return warp_reduce(v, SumOp{});
}

// Reduction over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
template <class T, class Op>
__device__ T block_reduce(T v, Op op, T identity) {
  __shared__ T part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_reduce(v, op);
  __syncthreads();  // part may still be read by a previous call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? part[lane] : identity;
  return warp_reduce(v, op);
}
template <class T>
__device__ T block_sum(T v) {
  return block_reduce(v, SumOp{}, T(0));
}

// Threads for a kernel that gives each row of n values one block (layer norm, softmax): a warp for
// short rows, doubled while every thread still gets two values or more, at most 512.
inline int row_block_threads(int64_t n) {
  int threads = 32;
  while (threads < 512 && 2 * static_cast<int64_t>(threads) < n) threads *= 2;
  return threads;
}

}  // namespace trainer::cuda
