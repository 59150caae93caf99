#pragma once
// Per-channel statistics on the device, shared by the batch-norm kernels (batch_norm.cu) and the
// synchronised batch norm's (sync_batch_norm.cu): views of [C] tensors, the channel reduction both
// directions run, and the store of a training batch's statistics (mean, invstd, running statistics).
//
// Layout: a channels-last input is walked in place as [N*H*W, C]; anything else is made contiguous
// and walked as [N, C, inner]. Element (o, c, i) sits at (o * C + c) * inner + i. Per-channel sums
// are accumulated in double, split over several blocks per channel and added in a fixed order by
// the last block of each channel group to finish (so results are deterministic and no second
// kernel is needed), or, for the channels-last reduction's many parts, by a small second kernel. Mean and
// variance come from one pass of sums shifted by each channel's first value (no cancellation when |mean| >>
// std); channels-last inputs are read 16 bytes per thread. Included only by .cu files.
#include <algorithm>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "nn/channel_layout.h"
#include "nn/cuda/kernels.cuh"

namespace trainer::cuda {

constexpr int kReduceThreads = 256;

// A [C] per-channel tensor read in place on the device, as double, whatever its floating dtype.
struct ChannelValues {
  const void* p = nullptr;
  DType dtype = DType::f32;
  __device__ __forceinline__ double operator[](int64_t c) const {
    switch (dtype) {
      case DType::f64:
        return static_cast<const double*>(p)[c];
      case DType::f16:
        return __half2float(static_cast<const __half*>(p)[c]);
      case DType::bf16:
        return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[c]);
      default:
        return static_cast<const float*>(p)[c];
    }
  }
  __device__ __forceinline__ double or_default(int64_t c, double fallback) const {
    return p ? (*this)[c] : fallback;
  }
};

// A dense [C] f32 or f64 tensor written in place on the device (running statistics).
struct ChannelTarget {
  void* p = nullptr;
  DType dtype = DType::f32;
  __device__ __forceinline__ void move_towards(int64_t c, double batch, double momentum) const {
    if (dtype == DType::f64) {
      double& r = static_cast<double*>(p)[c];
      r = (1.0 - momentum) * r + momentum * batch;
    } else {
      float& r = static_cast<float*>(p)[c];
      r = static_cast<float>((1.0 - momentum) * r + momentum * batch);
    }
  }
};

inline ChannelTarget channel_target(Tensor& t, int64_t C, const char* op, const char* name) {
  if (!t.defined()) return {};
  check_device(t, op, name);
  if (t.dim() != 1 || t.size(0) != C || (C > 1 && t.stride(0) != 1) ||
      (t.dtype() != DType::f32 && t.dtype() != DType::f64))
    throw std::invalid_argument(std::string(op) + ": " + name + " must be a dense f32 or f64 [" +
                                std::to_string(C) + "] tensor, got " + std::string(dtype_name(t.dtype())) +
                                " " + shape_str(t.shape()));
  return {t.raw_data(), t.dtype()};
}

// Stores channel c's batch statistics as bn_train_stats returns them: the mean, and the inverse std in
// stat_t, as the separate ops computed it (and PyTorch does: a last-bit difference here flips ReLUs
// downstream); the running statistics move towards the batch's (the unbiased variance).
template <class stat_t>
struct StoreBatchStats {
  stat_t* mean;
  stat_t* invstd;
  ChannelTarget running_mean, running_var;
  double eps, momentum, unbias;
  __device__ void operator()(int64_t c, double m, double var) const {
    mean[c] = static_cast<stat_t>(m);
    invstd[c] = stat_t(1) / sqrt(static_cast<stat_t>(var) + static_cast<stat_t>(eps));
    if (running_mean.p) {
      running_mean.move_towards(c, m, momentum);
      running_var.move_towards(c, var * unbias, momentum);
    }
  }
};

// What a training-mode statistics pass over n values per channel writes: mean and invstd [C] in
// `stats` (f32 for half inputs), made here, and the running statistics, checked here. Shared by the
// pass over x and the one from a convolution's sums (train.cudnn_fusion).
struct BatchStatsOutputs {
  Tensor mean, invstd;
  ChannelTarget running_mean, running_var;
  double unbias;  // n / (n - 1): the running variance is the unbiased one
  template <class stat_t>
  StoreBatchStats<stat_t> store(double eps, double momentum) const {
    return {static_cast<stat_t*>(mean.raw_data()),
            static_cast<stat_t*>(invstd.raw_data()),
            running_mean,
            running_var,
            eps,
            momentum,
            unbias};
  }
};

inline BatchStatsOutputs batch_stats_outputs(const char* op, int64_t C, double n, DType stats,
                                             Tensor& running_mean, Tensor& running_var) {
  return {empty({C}, stats), empty({C}, stats), channel_target(running_mean, C, op, "running_mean"),
          channel_target(running_var, C, op, "running_var"), n > 1 ? n / (n - 1.0) : 1.0};
}

// Validates a per-channel tensor and returns a view of it for the kernels; `keep` holds a dense
// device copy when t was not one already (undefined t gives a null view when optional).
inline ChannelValues channel_values(const Tensor& t, int64_t C, const char* op, const char* name,
                                    bool optional, Tensor& keep) {
  if (!t.defined()) {
    if (!optional) throw std::invalid_argument(std::string(op) + ": " + name + " is undefined");
    return {};
  }
  if (t.dim() != 1 || t.size(0) != C)
    throw std::invalid_argument(std::string(op) + ": " + name + " must have shape [" + std::to_string(C) +
                                "], got " + shape_str(t.shape()));
  check_floating(t.dtype(), op);
  keep = t;
  if (!t.device().is_cuda() || t.device() != current_device() || (C > 1 && t.stride(0) != 1))
    keep = t.to(current_device()).contiguous();
  return {keep.raw_data(), keep.dtype()};
}

// Arrival counters of the "last block finishes" reductions: zero between kernels (the last block
// of each group resets its counter), so one buffer serves every launch on the compute stream.
// A buffer that is outgrown is kept, not freed: a captured CUDA graph may still use its address.
inline unsigned* arrival_counters(int64_t groups) {
  static std::mutex mutex;
  static auto* buffers = new std::vector<Tensor>();  // leaked: may outlive the allocator's users at exit
  std::lock_guard<std::mutex> lock(mutex);
  if (buffers->empty() || buffers->back().numel() < groups)
    buffers->push_back(Tensor::zeros({std::max<int64_t>(groups, 4096)}, DType::i64, current_device()));
  return static_cast<unsigned*>(buffers->back().raw_data());
}

enum Mode { kMoments, kBackward };

// What mode M adds per element: kMoments the shifted sums of x - shift and (x - shift)^2 (the shift
// is each channel's first element, so the variance's one pass has no cancellation when |mean| >>
// std), kBackward the sums of dy and dy * (x - mean).
template <int M, class A>
__device__ __forceinline__ void accumulate(A& a0, A& a1, A v, A g, A m) {
  const A d = v - m;
  if constexpr (M == kMoments) {
    a0 += d;
    a1 += d * d;
  } else {
    a0 += g;
    a1 += g * d;
  }
}

// dy[i], or 0 where the fused ReLU's output mask[i] is not positive (the ReLU's backward).
template <class T>
__device__ __forceinline__ acc_t<T> masked_grad(const T* dy, const T* mask, int64_t i) {
  return mask && !(to_acc(mask[i]) > acc_t<T>(0)) ? acc_t<T>(0) : to_acc(dy[i]);
}

// The value kMoments subtracts from channel c's elements: its first, x[c * inner] (row 0's for
// channels-last, where inner is 1).
template <class T>
__device__ __forceinline__ double moments_shift(const T* x, int64_t c, int64_t inner) {
  return to_acc(x[c * inner]);
}

// Mean and biased variance of channel c from kMoments' shifted sums s = sum(x - k) and
// q = sum((x - k)^2) over n values, k = moments_shift(x, c, inner).
struct Moments {
  double mean, var;
};
template <class T>
__device__ __forceinline__ Moments moments_of(const T* x, int64_t c, int64_t inner, double s, double q,
                                              double n) {
  const double d = s / n;
  return {moments_shift(x, c, inner) + d, fmax(q / n - d * d, 0.0)};
}

// The last block of a channel group to finish adds the parts of channel c in order (deterministic).
template <class Finish>
__device__ __forceinline__ void finish_channel(const double* partial, int64_t c, int parts, Finish& finish) {
  double s0 = 0.0, s1 = 0.0;
  for (int p = 0; p < parts; ++p) {
    s0 += __ldcg(&partial[(c * parts + p) * 2]);
    s1 += __ldcg(&partial[(c * parts + p) * 2 + 1]);
  }
  finish(c, s0, s1);
}

// Block (channel group, part) -> partial[(c * parts + part) * 2 + k]; the last block of a group to
// finish then calls finish(c, sum0, sum1) for each channel of the group, adding the parts in order.
// For inner > 1 a group is one channel (threads along the contiguous inner run, 4 elements at a
// time when inner % 4 == 0); for inner == 1 a group is 32 channels (lanes along C, 8 rows of
// warps), so both layouts read memory coalesced. `centre` is the per-channel value subtracted
// (the mean for kBackward; unused for kMoments, which shifts by the channel's first element).
template <class T, int M, class Finish>
__global__ void channel_reduce_kernel(const T* x, const T* dy, const T* mask, ChannelValues centre,
                                      int64_t outer, int64_t C, int64_t inner, int parts, double* partial,
                                      unsigned* counters, Finish finish) {
  const int part = static_cast<int>(blockIdx.x % parts);
  const int64_t group = blockIdx.x / parts;
  double a0 = 0.0, a1 = 0.0;
  __shared__ bool last;
  if (inner > 1) {
    const bool vec = inner % 4 == 0;  // parts then start at multiples of 4 (the last may be empty)
    const int64_t c = group, total = outer * inner;
    const int64_t chunk = vec ? ((total + parts - 1) / parts + 3) / 4 * 4 : (total + parts - 1) / parts;
    const int64_t begin = part * chunk, end = min(total, begin + chunk);
    const double m = M == kMoments ? to_acc(x[c * inner]) : centre[c];
    if (vec) {
      // 4 consecutive positions share o: one division per 4 elements.
      for (int64_t q = begin + 4 * threadIdx.x; q < end; q += 4 * blockDim.x) {
        const int64_t o = q / inner, base = (o * C + c) * inner + (q - o * inner);
#pragma unroll
        for (int j = 0; j < 4; ++j)
          accumulate<M, double>(a0, a1, to_acc(x[base + j]),
                                M == kBackward ? masked_grad(dy, mask, base + j) : 0.0, m);
      }
    } else {
      for (int64_t q = begin + threadIdx.x; q < end; q += blockDim.x) {
        const int64_t o = q / inner, idx = (o * C + c) * inner + (q - o * inner);
        accumulate<M, double>(a0, a1, to_acc(x[idx]), M == kBackward ? masked_grad(dy, mask, idx) : 0.0, m);
      }
    }
    a0 = block_sum(a0);
    a1 = block_sum(a1);
    if (threadIdx.x == 0) {
      partial[(c * parts + part) * 2] = a0;
      partial[(c * parts + part) * 2 + 1] = a1;
      __threadfence();
      last = atomicAdd(&counters[group], 1u) == static_cast<unsigned>(parts - 1);
    }
    __syncthreads();
    if (last && threadIdx.x == 0) {
      __threadfence();
      counters[group] = 0;
      finish_channel(partial, c, parts, finish);
    }
    return;
  }
  __shared__ double rows[2][kReduceThreads / 32][33];
  const int lane = threadIdx.x & 31, row = threadIdx.x >> 5, nrows = blockDim.x >> 5;
  const int64_t c = group * 32 + lane, chunk = (outer + parts - 1) / parts;
  const int64_t begin = part * chunk, end = min(outer, begin + chunk);
  if (c < C) {
    const double m = M == kMoments ? to_acc(x[c]) : centre[c];
    for (int64_t o = begin + row; o < end; o += nrows)
      accumulate<M, double>(a0, a1, to_acc(x[o * C + c]),
                            M == kBackward ? masked_grad(dy, mask, o * C + c) : 0.0, m);
  }
  rows[0][row][lane] = a0;
  rows[1][row][lane] = a1;
  __syncthreads();
  if (row == 0) {
    if (c < C) {
      double s0 = 0.0, s1 = 0.0;
      for (int r = 0; r < nrows; ++r) s0 += rows[0][r][lane], s1 += rows[1][r][lane];
      partial[(c * parts + part) * 2] = s0;
      partial[(c * parts + part) * 2 + 1] = s1;
    }
    __threadfence();
  }
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&counters[group], 1u) == static_cast<unsigned>(parts - 1);
  __syncthreads();
  if (last && row == 0) {
    __threadfence();
    if (c < C) finish_channel(partial, c, parts, finish);
    if (lane == 0) counters[group] = 0;
  }
}

// The channels-last reduction with 16-byte loads: each thread owns V = 16 / sizeof(T) neighbouring
// channels of a row, `per_row` threads cover a group of per_row * V channels and the block's
// 256 / per_row rows of threads walk the part's rows. Needs C % V == 0 and 16-byte aligned inputs.
// A thread sums its few hundred values in f32 for the half types (the shift keeps them small) and
// in double otherwise; the block and the parts add in double. Few registers per thread, so
// several blocks share an SM and keep enough loads in flight.
template <class T, int M>
__global__ void __launch_bounds__(kReduceThreads, 2)
    channel_reduce_cl16_kernel(const T* x, const T* dy, const T* mask, ChannelValues centre, int64_t outer,
                               int64_t C, int per_row, int parts, double* partial) {
  using P = Pack16<T>;
  constexpr int V = P::kSize;
  __shared__ double sums[2][kReduceThreads * V];
  const int part = static_cast<int>(blockIdx.x % parts);
  const int64_t group = blockIdx.x / parts;
  const int nrows = kReduceThreads / per_row, lane = threadIdx.x % per_row, row = threadIdx.x / per_row;
  const int64_t cv = group * per_row + lane, vectors = C / V;  // cv: this thread's channel vector
  const bool active = row < nrows && cv < vectors;
  const int64_t chunk = (outer + parts - 1) / parts, begin = part * chunk, end = min(outer, begin + chunk);
  using A = std::conditional_t<sizeof(T) == 2, float, double>;  // f32 sums for the half types only
  A a0[V] = {}, a1[V] = {}, m[V];
  if (active) {
    const P first = reinterpret_cast<const P*>(x)[cv];
#pragma unroll
    for (int j = 0; j < V; ++j)
      m[j] = M == kMoments ? to_acc(first.v[j]) : static_cast<A>(centre[cv * V + j]);
    // U rows per iteration, their loads issued before any arithmetic (more bytes in flight).
    constexpr int U = 4;
    int64_t o = begin + row;
    for (; o + (U - 1) * nrows < end; o += U * nrows) {
      P xv[U], gv[U], mv[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        xv[u] = reinterpret_cast<const P*>(x + (o + u * nrows) * C)[cv];
        if constexpr (M == kBackward) {
          gv[u] = reinterpret_cast<const P*>(dy + (o + u * nrows) * C)[cv];
          if (mask) mv[u] = reinterpret_cast<const P*>(mask + (o + u * nrows) * C)[cv];
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int j = 0; j < V; ++j) {
          A g = A(0);
          if constexpr (M == kBackward) g = mask && !(to_acc(mv[u].v[j]) > 0) ? A(0) : A(to_acc(gv[u].v[j]));
          accumulate<M, A>(a0[j], a1[j], to_acc(xv[u].v[j]), g, m[j]);
        }
    }
    for (; o < end; o += nrows) {
      const P xv = reinterpret_cast<const P*>(x + o * C)[cv];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const int64_t i = o * C + cv * V + j;
        accumulate<M, A>(a0[j], a1[j], to_acc(xv.v[j]), M == kBackward ? A(masked_grad(dy, mask, i)) : A(0),
                         m[j]);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < V; ++j) {
    sums[0][threadIdx.x * V + j] = a0[j];
    sums[1][threadIdx.x * V + j] = a1[j];
  }
  __syncthreads();
  // Row sums per channel, a thread per channel of the group: thread t's V values sit at
  // sums[k][(row * per_row + lane) * V + j], i.e. channel e = lane * V + j of row r at r * width + e.
  const int width = per_row * V;
  for (int e = threadIdx.x; e < width; e += kReduceThreads) {
    const int64_t c = group * width + e;
    if (c >= C) break;
    double s0 = 0.0, s1 = 0.0;
    for (int r = 0; r < nrows; ++r) s0 += sums[0][r * width + e], s1 += sums[1][r * width + e];
    partial[(c * parts + part) * 2] = s0;
    partial[(c * parts + part) * 2 + 1] = s1;
  }
}

// finish(c, sum0, sum1) for every channel from its parts' sums: a warp per channel, lanes across
// the parts (a fixed order, so deterministic). A kernel of its own: the channels-last reduction
// splits each channel into hundreds of parts, and one block adding them all was its bottleneck.
template <class Finish>
__global__ void finish_parts_kernel(const double* partial, int64_t C, int parts, Finish finish) {
  const int lane = threadIdx.x & 31;
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + (threadIdx.x >> 5);
  if (c >= C) return;
  double s0 = 0.0, s1 = 0.0;
  for (int p = lane; p < parts; p += 32) {
    s0 += partial[(c * parts + p) * 2];
    s1 += partial[(c * parts + p) * 2 + 1];
  }
  s0 = warp_sum(s0);
  s1 = warp_sum(s1);
  if (lane == 0) finish(c, s0, s1);
}

// Per-channel sums of mode M over x (and dy), handed to finish(c, sum0, sum1) on the device.
template <class T, int M, class Finish>
void channel_reduce(const ChannelLayout& l, const T* x, const T* dy, const T* mask, ChannelValues centre,
                    Finish finish) {
  if (l.channels == 0) return;
  constexpr int V = Pack16<T>::kSize;
  const bool cl16 = l.inner == 1 && l.channels % V == 0 && aligned16(x) && (!dy || aligned16(dy)) &&
                    (!mask || aligned16(mask));
  // At most a warp across a row (256 bf16 channels, 512 bytes): wide layers then split into several
  // channel groups, so that their few rows still spread over every SM.
  const int per_row = cl16 ? static_cast<int>(std::min<int64_t>(l.channels / V, 32)) : 0;
  const int64_t groups = cl16          ? (l.channels / V + per_row - 1) / per_row
                         : l.inner > 1 ? l.channels
                                       : (l.channels + 31) / 32;
  // Work per block floor: 2048 elements of a channel, or 64 rows of the block's channels.
  const int64_t rows = l.inner > 1 ? l.per_channel() / 2048 : l.outer / 64;
  const int64_t target = static_cast<int64_t>(cuda_context().sm_count) * 4;
  const int parts = static_cast<int>(
      std::clamp<int64_t>((target + groups - 1) / groups, 1, std::clamp<int64_t>(rows, 1, 1024)));
  Tensor partial = empty({l.channels * parts * 2}, DType::f64);
  const unsigned blocks = static_cast<unsigned>(groups * parts);
  double* pp = static_cast<double*>(partial.raw_data());
  if (cl16) {
    channel_reduce_cl16_kernel<T, M><<<blocks, kReduceThreads, 0, cuda_stream()>>>(
        x, dy, mask, centre, l.outer, l.channels, per_row, parts, pp);
    CUDA_CHECK_LAUNCH();
    finish_parts_kernel<<<static_cast<unsigned>((l.channels + 7) / 8), kReduceThreads, 0, cuda_stream()>>>(
        pp, l.channels, parts, finish);
  } else {
    channel_reduce_kernel<T, M><<<blocks, kReduceThreads, 0, cuda_stream()>>>(
        x, dy, mask, centre, l.outer, l.channels, l.inner, parts, pp, arrival_counters(groups), finish);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace trainer::cuda
