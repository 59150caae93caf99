// Batch-norm kernels, split like the CPU backend's (statistics, apply, backward reduce, backward
// input) so a data-parallel layer can all-reduce the per-channel sums between the pieces.
//
// Layout: a channels-last input is walked in place as [N*H*W, C]; anything else is made contiguous
// and walked as [N, C, inner]. Element (o, c, i) sits at (o * C + c) * inner + i. Per-channel sums
// are accumulated in double, split over several blocks per channel and added in a fixed order, so
// results are deterministic; the variance takes two passes (no cancellation when |mean| >> std).
#include "nn/cuda/kernels.cuh"

namespace trainer {
namespace cuda {
namespace {

constexpr int kThreads = 256;

struct ChannelLayout {
  bool channels_last = false;
  int64_t outer = 0, channels = 0, inner = 1;
  int64_t per_channel() const { return outer * inner; }
  MemoryFormat format() const {
    return channels_last ? MemoryFormat::channels_last : MemoryFormat::contiguous;
  }
};

ChannelLayout channel_layout(const Tensor& x, const char* op) {
  if (x.dim() < 2)
    throw std::invalid_argument(std::string(op) + ": input must be [N, C, ...], got shape " +
                                shape_str(x.shape()));
  ChannelLayout l;
  l.channels = x.size(1);
  if (x.suggest_memory_format() == MemoryFormat::channels_last) {
    l.channels_last = true;
    l.outer = x.size(0) * x.size(2) * x.size(3);
  } else {
    l.outer = x.size(0);
    for (int d = 2; d < x.dim(); ++d) l.inner *= x.size(d);
  }
  return l;
}

void check_same(const Tensor& a, const Tensor& x, const char* op, const char* name) {
  check_device(a, op, name);
  if (a.shape() != x.shape())
    throw std::invalid_argument(std::string(op) + ": " + name + " has shape " + shape_str(a.shape()) +
                                ", input has " + shape_str(x.shape()));
  check_same_dtype(a, x, op);
}

// A [C] per-channel tensor as contiguous device doubles; undefined when optional and undefined.
Tensor channel_f64(const Tensor& t, int64_t C, const char* op, const char* name, bool optional) {
  if (!t.defined()) {
    if (!optional) throw std::invalid_argument(std::string(op) + ": " + name + " is undefined");
    return Tensor();
  }
  if (t.dim() != 1 || t.size(0) != C)
    throw std::invalid_argument(std::string(op) + ": " + name + " must have shape [" + std::to_string(C) +
                                "], got " + shape_str(t.shape()));
  return t.to(current_device()).to(DType::f64).contiguous();
}
const double* f64_ptr(const Tensor& t) {
  return t.defined() ? static_cast<const double*>(t.raw_data()) : nullptr;
}

enum Mode { kSum, kSquaredDeviation, kBackward };

// Block (channel group, part) -> partial[(c * parts + part) * 2 + k]. For inner > 1 a block covers
// one channel (threads along the contiguous inner run); for inner == 1 a block covers 32 channels
// (lanes along C, 8 rows of warps), so both layouts read memory coalesced.
template <class T, int M>
__global__ void channel_reduce_kernel(const T* x, const T* dy, const double* mean, int64_t outer, int64_t C,
                                      int64_t inner, int parts, double* partial) {
  const int part = static_cast<int>(blockIdx.x % parts);
  const int64_t group = blockIdx.x / parts;
  double a0 = 0.0, a1 = 0.0;
  auto add = [&](int64_t idx, int64_t c) {
    const double v = to_acc(x[idx]);
    if constexpr (M == kSum) {
      a0 += v;
    } else if constexpr (M == kSquaredDeviation) {
      const double d = v - mean[c];
      a0 += d * d;
    } else {
      const double g = to_acc(dy[idx]);
      a0 += g;
      a1 += g * (v - mean[c]);
    }
  };
  if (inner > 1) {
    const int64_t c = group, total = outer * inner, chunk = (total + parts - 1) / parts;
    const int64_t begin = part * chunk, end = min(total, begin + chunk);
    for (int64_t m = begin + threadIdx.x; m < end; m += blockDim.x) {
      const int64_t o = m / inner;
      add((o * C + c) * inner + (m - o * inner), c);
    }
    a0 = block_sum(a0);
    if constexpr (M == kBackward) a1 = block_sum(a1);
    if (threadIdx.x == 0) {
      partial[(c * parts + part) * 2] = a0;
      partial[(c * parts + part) * 2 + 1] = a1;
    }
    return;
  }
  __shared__ double rows[2][kThreads / 32][33];
  const int lane = threadIdx.x & 31, row = threadIdx.x >> 5, nrows = blockDim.x >> 5;
  const int64_t c = group * 32 + lane, chunk = (outer + parts - 1) / parts;
  const int64_t begin = part * chunk, end = min(outer, begin + chunk);
  if (c < C)
    for (int64_t o = begin + row; o < end; o += nrows) add(o * C + c, c);
  rows[0][row][lane] = a0;
  rows[1][row][lane] = a1;
  __syncthreads();
  if (row == 0 && c < C) {
    double s0 = 0.0, s1 = 0.0;
    for (int r = 0; r < nrows; ++r) s0 += rows[0][r][lane], s1 += rows[1][r][lane];
    partial[(c * parts + part) * 2] = s0;
    partial[(c * parts + part) * 2 + 1] = s1;
  }
}

// Per-channel sums [C, parts, 2] of mode M over x (and dy), before the final add over parts.
template <class T, int M>
Tensor channel_partials(const ChannelLayout& l, const T* x, const T* dy, const double* mean, int& parts) {
  const int64_t groups = l.inner > 1 ? l.channels : (l.channels + 31) / 32;
  const int64_t rows = l.inner > 1 ? l.per_channel() / 2048 : l.outer / 64;  // work per block floor
  const int64_t target = static_cast<int64_t>(cuda_context().sm_count) * 4;
  parts = static_cast<int>(
      std::clamp<int64_t>((target + groups - 1) / groups, 1, std::clamp<int64_t>(rows, 1, 1024)));
  Tensor partial = empty({l.channels * parts * 2}, DType::f64);
  channel_reduce_kernel<T, M><<<static_cast<unsigned>(groups * parts), kThreads, 0, cuda_stream()>>>(
      x, dy, mean, l.outer, l.channels, l.inner, parts, static_cast<double*>(partial.raw_data()));
  CUDA_CHECK_LAUNCH();
  return partial;
}

// out = (x - m[c]) * a[c] + b[c] (+ g * s[c] when g is given), in x's dense layout.
template <class T>
void channel_affine(const ChannelLayout& l, int64_t n, const T* x, const T* g, T* out, const Tensor& coeff) {
  using acc = acc_t<T>;
  const acc* k = static_cast<const acc*>(coeff.raw_data());
  const int64_t C = l.channels, inner = l.inner;
  for_each(n, [=] __device__(int64_t i) {
    const int64_t c = (i / inner) % C;
    acc v = (to_acc(x[i]) - k[c]) * k[C + c] + k[2 * C + c];
    if (g) v += to_acc(g[i]) * k[3 * C + c];
    out[i] = store<T>(v);
  });
}

DType acc_dtype(DType dtype) { return dtype == DType::f64 ? DType::f64 : DType::f32; }

}  // namespace
}  // namespace cuda

std::pair<Tensor, Tensor> CudaBackend::bn_mean_var(const Tensor& x_in) {
  using namespace cuda;
  check_device(x_in, "bn_mean_var", "input");
  const ChannelLayout l = channel_layout(x_in, "bn_mean_var");
  if (l.per_channel() == 0)
    throw std::invalid_argument("bn_mean_var: no values per channel in input of shape " +
                                shape_str(x_in.shape()));
  const Tensor x = x_in.contiguous(l.format());
  const int64_t C = l.channels;
  const double n = static_cast<double>(l.per_channel());
  Tensor mean = empty({C}, x.dtype()), var = empty({C}, x.dtype()), mean_d = empty({C}, DType::f64);
  CUDA_DISPATCH_FLOAT(x.dtype(), "bn_mean_var", [&] {
    const scalar_t* px = static_cast<const scalar_t*>(x.raw_data());
    double* pm = static_cast<double*>(mean_d.raw_data());
    int parts = 1;
    Tensor sums = channel_partials<scalar_t, kSum>(l, px, nullptr, nullptr, parts);
    const double* ps = static_cast<const double*>(sums.raw_data());
    for_each(C, [=] __device__(int64_t c) {
      double s = 0.0;
      for (int p = 0; p < parts; ++p) s += ps[(c * parts + p) * 2];
      pm[c] = s / n;
    });
    Tensor sq = channel_partials<scalar_t, kSquaredDeviation>(l, px, nullptr, pm, parts);
    const double* pq = static_cast<const double*>(sq.raw_data());
    scalar_t* out_mean = static_cast<scalar_t*>(mean.raw_data());
    scalar_t* out_var = static_cast<scalar_t*>(var.raw_data());
    for_each(C, [=] __device__(int64_t c) {
      double s = 0.0;
      for (int p = 0; p < parts; ++p) s += pq[(c * parts + p) * 2];
      out_mean[c] = from_acc<scalar_t>(pm[c]);
      out_var[c] = from_acc<scalar_t>(s / n);
    });
  });
  return {mean, var};
}

Tensor CudaBackend::bn_apply(const Tensor& x_in, const Tensor& mean_t, const Tensor& invstd_t,
                             const Tensor& gamma_t, const Tensor& beta_t) {
  using namespace cuda;
  check_device(x_in, "bn_apply", "input");
  const ChannelLayout l = channel_layout(x_in, "bn_apply");
  const int64_t C = l.channels;
  const Tensor mean_d = channel_f64(mean_t, C, "bn_apply", "mean", false),
               invstd_d = channel_f64(invstd_t, C, "bn_apply", "invstd", false),
               gamma_d = channel_f64(gamma_t, C, "bn_apply", "weight", true),
               beta_d = channel_f64(beta_t, C, "bn_apply", "bias", true);
  const double *mean = f64_ptr(mean_d), *invstd = f64_ptr(invstd_d), *gamma = f64_ptr(gamma_d),
               *beta = f64_ptr(beta_d);
  const Tensor x = x_in.contiguous(l.format());
  Tensor y = empty(x.shape(), x.dtype(), l.format());
  CUDA_DISPATCH_FLOAT(x.dtype(), "bn_apply", [&] {
    using acc = acc_t<scalar_t>;
    Tensor coeff = empty({4 * C}, acc_dtype(x.dtype()));
    acc* k = static_cast<acc*>(coeff.raw_data());
    for_each(C, [=] __device__(int64_t c) {
      k[c] = static_cast<acc>(mean[c]);
      k[C + c] = static_cast<acc>(invstd[c] * (gamma ? gamma[c] : 1.0));
      k[2 * C + c] = static_cast<acc>(beta ? beta[c] : 0.0);
      k[3 * C + c] = acc(0);
    });
    channel_affine<scalar_t>(l, x.numel(), static_cast<const scalar_t*>(x.raw_data()), nullptr,
                             static_cast<scalar_t*>(y.raw_data()), coeff);
  });
  return y;
}

std::pair<Tensor, Tensor> CudaBackend::bn_backward_reduce(const Tensor& grad_y, const Tensor& x_in,
                                                          const Tensor& mean_t, const Tensor& invstd_t) {
  using namespace cuda;
  check_device(x_in, "bn_backward_reduce", "input");
  const ChannelLayout l = channel_layout(x_in, "bn_backward_reduce");
  check_same(grad_y, x_in, "bn_backward_reduce", "grad_y");
  const int64_t C = l.channels;
  const Tensor mean_d = channel_f64(mean_t, C, "bn_backward_reduce", "mean", false),
               invstd_d = channel_f64(invstd_t, C, "bn_backward_reduce", "invstd", false);
  const Tensor x = x_in.contiguous(l.format()), g = grad_y.contiguous(l.format());
  Tensor sum_dy = empty({C}, x.dtype()), sum_dy_xhat = empty({C}, x.dtype());
  CUDA_DISPATCH_FLOAT(x.dtype(), "bn_backward_reduce", [&] {
    int parts = 1;
    Tensor sums = channel_partials<scalar_t, kBackward>(l, static_cast<const scalar_t*>(x.raw_data()),
                                                        static_cast<const scalar_t*>(g.raw_data()),
                                                        f64_ptr(mean_d), parts);
    const double* ps = static_cast<const double*>(sums.raw_data());
    const double* invstd = f64_ptr(invstd_d);
    scalar_t* o0 = static_cast<scalar_t*>(sum_dy.raw_data());
    scalar_t* o1 = static_cast<scalar_t*>(sum_dy_xhat.raw_data());
    for_each(C, [=] __device__(int64_t c) {
      double s0 = 0.0, s1 = 0.0;
      for (int p = 0; p < parts; ++p) s0 += ps[(c * parts + p) * 2], s1 += ps[(c * parts + p) * 2 + 1];
      o0[c] = from_acc<scalar_t>(s0);
      o1[c] = from_acc<scalar_t>(s1 * invstd[c]);
    });
  });
  return {sum_dy, sum_dy_xhat};
}

Tensor CudaBackend::bn_backward_input(const Tensor& grad_y, const Tensor& x_in, const Tensor& mean_t,
                                      const Tensor& invstd_t, const Tensor& gamma_t, const Tensor& sum_dy_t,
                                      const Tensor& sum_dy_xhat_t, int64_t count) {
  using namespace cuda;
  check_device(x_in, "bn_backward_input", "input");
  const ChannelLayout l = channel_layout(x_in, "bn_backward_input");
  check_same(grad_y, x_in, "bn_backward_input", "grad_y");
  if (count <= 0)
    throw std::invalid_argument("bn_backward_input: count must be positive, got " + std::to_string(count));
  const int64_t C = l.channels;
  const char* op = "bn_backward_input";
  const Tensor mean_d = channel_f64(mean_t, C, op, "mean", false),
               invstd_d = channel_f64(invstd_t, C, op, "invstd", false),
               gamma_d = channel_f64(gamma_t, C, op, "weight", true),
               sum_dy_d = channel_f64(sum_dy_t, C, op, "sum_dy", false),
               sum_dy_xhat_d = channel_f64(sum_dy_xhat_t, C, op, "sum_dy_xhat", false);
  const double *mean = f64_ptr(mean_d), *invstd = f64_ptr(invstd_d), *gamma = f64_ptr(gamma_d),
               *sum_dy = f64_ptr(sum_dy_d), *sum_dy_xhat = f64_ptr(sum_dy_xhat_d);
  const Tensor x = x_in.contiguous(l.format()), g = grad_y.contiguous(l.format());
  Tensor gx = empty(x.shape(), x.dtype(), l.format());
  const double n = static_cast<double>(count);
  CUDA_DISPATCH_FLOAT(x.dtype(), op, [&] {
    using acc = acc_t<scalar_t>;
    // grad_x = (dy - mean(dy) - xhat * mean(dy * xhat)) * invstd * gamma, as (x - mean) * a + b + dy * s.
    Tensor coeff = empty({4 * C}, acc_dtype(x.dtype()));
    acc* k = static_cast<acc*>(coeff.raw_data());
    for_each(C, [=] __device__(int64_t c) {
      const double scale = invstd[c] * (gamma ? gamma[c] : 1.0);
      k[c] = static_cast<acc>(mean[c]);
      k[C + c] = static_cast<acc>(-sum_dy_xhat[c] / n * invstd[c] * scale);
      k[2 * C + c] = static_cast<acc>(-sum_dy[c] / n * scale);
      k[3 * C + c] = static_cast<acc>(scale);
    });
    channel_affine<scalar_t>(l, x.numel(), static_cast<const scalar_t*>(x.raw_data()),
                             static_cast<const scalar_t*>(g.raw_data()),
                             static_cast<scalar_t*>(gx.raw_data()), coeff);
  });
  return gx;
}

}  // namespace trainer
