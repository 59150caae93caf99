// Batch-norm kernels, split like the CPU backend's (statistics, apply, backward reduce, backward
// input) so a data-parallel layer can all-reduce the per-channel sums between the pieces. The
// reductions and the statistics' store are in channel_stats.cuh (the layouts are described there).
//
// Per-channel inputs (mean, invstd, gamma, sums) are read in place in whatever floating dtype they
// have: no conversion kernels. Each piece is one kernel: a reduction, or an elementwise pass
// (16 bytes at a time when the layout allows) that computes its per-channel coefficients itself.
#include <optional>
#include <type_traits>

#include "nn/channel_layout.h"
#include "nn/cuda/channel_stats.cuh"
#include "nn/cuda/conv_stats_fusion.h"
#include "nn/cuda/kernels.cuh"

namespace trainer {
namespace cuda {
namespace {

constexpr int kThreads = 256;

void check_same(const Tensor& a, const Tensor& x, const char* op, const char* name) {
  check_device(a, op, name);
  if (a.shape() != x.shape())
    throw std::invalid_argument(std::string(op) + ": " + name + " has shape " + shape_str(a.shape()) +
                                ", input has " + shape_str(x.shape()));
  check_same_dtype(a, x, op);
}

// Per-channel coefficients of the affine pass out = (x - k0) * k1 + k2 (+ g * k3), computed in double
// from the per-channel inputs and rounded to the compute type; k is [4][C].
struct ForwardCoefficients {  // y = (x - mean) * invstd * gamma + beta (+ residual)
  ChannelValues mean, invstd, gamma, beta;
  bool residual;
  template <class A>
  __device__ void operator()(int64_t c, int64_t C, A* k) const {
    k[c] = static_cast<A>(mean[c]);
    k[C + c] = static_cast<A>(invstd[c] * gamma.or_default(c, 1.0));
    k[2 * C + c] = static_cast<A>(beta.or_default(c, 0.0));
    k[3 * C + c] = A(residual ? 1 : 0);
  }
};
struct BackwardCoefficients {  // grad_x = (dy - mean(dy) - xhat * mean(dy * xhat)) * invstd * gamma
  ChannelValues mean, invstd, gamma, sum_dy, sum_dy_xhat;
  double n;
  template <class A>
  __device__ void operator()(int64_t c, int64_t C, A* k) const {
    const double is = invstd[c], scale = is * gamma.or_default(c, 1.0);
    k[c] = static_cast<A>(mean[c]);
    k[C + c] = static_cast<A>(-sum_dy_xhat[c] / n * is * scale);
    k[2 * C + c] = static_cast<A>(-sum_dy[c] / n * scale);
    k[3 * C + c] = static_cast<A>(scale);
  }
};

template <class A, class Coefficients>
__global__ void coefficients_kernel(Coefficients coefficients, int64_t C, A* k) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < C;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x)
    coefficients(c, C, k);
}

// out = act((x - k0[c]) * k1[c] + k2[c] (+ g * k3[c] when g is given)), act = ReLU when kRelu, in
// x's dense layout:
// c = (i / inner) % C, or i % C for channels-last (inner == 1). Each block first computes the
// coefficients into shared memory (no separate kernel), unless `global_k` already holds them.
template <class T, bool kWithGrad, bool kRelu, class Coefficients>
__global__ void channel_affine_kernel(int64_t n, const T* __restrict__ x, const T* __restrict__ g,
                                      const T* __restrict__ mask, T* __restrict__ out,
                                      Coefficients coefficients, const acc_t<T>* global_k, int64_t C,
                                      int64_t inner, bool vec) {
  using acc = acc_t<T>;
  extern __shared__ __align__(16) unsigned char shared_k[];
  const acc* k = global_k;
  if (!k) {
    acc* sk = reinterpret_cast<acc*>(shared_k);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) coefficients(c, C, sk);
    __syncthreads();
    k = sk;
  }
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (vec) {  // n, inner (or C when inner == 1) multiples of V and pointers 16-byte aligned
    using P = Pack16<T>;
    constexpr int V = P::kSize;
    const P* xv = reinterpret_cast<const P*>(x);
    const P* gv = reinterpret_cast<const P*>(g);
    P* ov = reinterpret_cast<P*>(out);
    // One 16-byte pack: out[j] from x[j] (and g[j], mask[j]) with channel j's coefficients kj(j, s).
    auto apply = [&](int64_t q, auto kj) {
      const P xs = xv[q];
      [[maybe_unused]] P gs, ms;
      if constexpr (kWithGrad) {
        gs = gv[q];
        if (mask) ms = reinterpret_cast<const P*>(mask)[q];
      }
      P r;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        acc v = (to_acc(xs.v[j]) - kj(j, 0)) * kj(j, 1) + kj(j, 2);
        if constexpr (kWithGrad)
          if (!mask || to_acc(ms.v[j]) > acc(0)) v += to_acc(gs.v[j]) * kj(j, 3);
        if constexpr (kRelu) v = v > acc(0) ? v : acc(0);
        r.v[j] = store<T>(v);
      }
      ov[q] = r;
    };
    // Channels-last with a stride that is a multiple of C: every thread keeps its V channels, so their
    // coefficients are read once into registers. Read per pack from shared memory instead, neighbouring
    // threads sit V floats apart: a V-way bank conflict on every coefficient (resnet50's BN kernels
    // took 1.6x longer that way).
    if (inner == 1 && (stride * V) % C == 0) {
      const int64_t c0 = (first * V) % C;
      acc kr[4][V];
#pragma unroll
      for (int j = 0; j < V; ++j)
#pragma unroll
        for (int s = 0; s < 4; ++s) kr[s][j] = k[s * C + c0 + j];
      for (int64_t q = first; q < n / V; q += stride) apply(q, [&](int j, int s) { return kr[s][j]; });
      return;
    }
    for (int64_t q = first; q < n / V; q += stride) {
      const int64_t i = V * q, c0 = (i / inner) % C;
      apply(q, [&](int j, int s) { return k[s * C + (inner == 1 ? c0 + j : c0)]; });
    }
    return;
  }
  for (int64_t i = first; i < n; i += stride) {
    const int64_t c = (i / inner) % C;
    acc v = (to_acc(x[i]) - k[c]) * k[C + c] + k[2 * C + c];
    if constexpr (kWithGrad) v += masked_grad(g, mask, i) * k[3 * C + c];
    if constexpr (kRelu) v = v > acc(0) ? v : acc(0);
    out[i] = store<T>(v);
  }
}

template <class T, class Coefficients>
void channel_affine(const ChannelLayout& l, int64_t n, const T* x, const T* g, T* out,
                    Coefficients coefficients, bool relu = false, const T* mask = nullptr) {
  if (n <= 0) return;
  using acc = acc_t<T>;
  const int64_t C = l.channels, run = l.inner > 1 ? l.inner : C;
  constexpr int V = Pack16<T>::kSize;
  const bool vec = n % V == 0 && run % V == 0 && aligned16(x) && aligned16(out) && (!g || aligned16(g)) &&
                   (!mask || aligned16(mask));
  // Few enough blocks that computing the coefficients per block stays cheap; each loops longer.
  const unsigned blocks = std::min<unsigned>(grid_size(vec ? n / V : n, kThreads),
                                             static_cast<unsigned>(cuda_context().sm_count) * 8);
  size_t shared = 4 * static_cast<size_t>(C) * sizeof(acc);
  Tensor global;
  const acc* gk = nullptr;
  if (shared > 32 * 1024) {  // many channels: one small kernel computes them into global memory
    global = empty({4 * C}, sizeof(acc) == 8 ? DType::f64 : DType::f32);
    coefficients_kernel<<<grid_size(C, kThreads), kThreads, 0, cuda_stream()>>>(
        coefficients, C, static_cast<acc*>(global.raw_data()));
    CUDA_CHECK_LAUNCH();
    gk = static_cast<const acc*>(global.raw_data());
    shared = 0;
  }
  auto launch = [&](auto with_g, auto with_relu) {
    channel_affine_kernel<T, decltype(with_g)::value, decltype(with_relu)::value>
        <<<blocks, kThreads, shared, cuda_stream()>>>(n, x, g, mask, out, coefficients, gk, C, l.inner, vec);
  };
  using yes = std::true_type;
  using no = std::false_type;
  if (g)
    relu ? launch(yes{}, yes{}) : launch(yes{}, no{});
  else
    relu ? launch(no{}, yes{}) : launch(no{}, no{});
  CUDA_CHECK_LAUNCH();
}

}  // namespace

std::pair<Tensor, Tensor> bn_train_stats_from_sums(const ChannelSums& sums, DType x_dtype, double eps,
                                                   double momentum, Tensor& running_mean,
                                                   Tensor& running_var) {
  const int64_t C = sums.sum.numel();
  if (sums.sum.dtype() != DType::f32 || sums.sqsum.dtype() != DType::f32 || sums.sqsum.numel() != C ||
      sums.count <= 0)
    throw std::invalid_argument("bn_train_stats_from_sums: expected two f32 [C] sums and a positive count");
  if (accumulate_dtype(x_dtype) != DType::f32)
    throw std::invalid_argument("bn_train_stats_from_sums: half inputs only");
  const double n = static_cast<double>(sums.count);
  const BatchStatsOutputs out =
      batch_stats_outputs("bn_train_stats", C, n, DType::f32, running_mean, running_var);
  const float* ps = static_cast<const float*>(sums.sum.raw_data());
  const float* pq = static_cast<const float*>(sums.sqsum.raw_data());
  const StoreBatchStats<float> store = out.store<float>(eps, momentum);
  for_each(C, [=] __device__(int64_t c) {
    // As bn_train_stats, from unshifted sums: the mean and biased variance in double.
    const double m = static_cast<double>(ps[c]) / n;
    store(c, m, fmax(static_cast<double>(pq[c]) / n - m * m, 0.0));
  });
  CUDA_CHECK_LAUNCH();
  return {out.mean, out.invstd};
}

}  // namespace cuda

std::pair<Tensor, Tensor> CudaBackend::bn_mean_var(const Tensor& x_in) {
  using namespace cuda;
  check_device(x_in, "bn_mean_var", "input");
  const ChannelLayout l = channel_layout(x_in, "bn_mean_var");
  if (l.per_channel() == 0)
    throw std::invalid_argument("bn_mean_var: no values per channel in input of shape " +
                                shape_str(x_in.shape()));
  const Tensor x = x_in.contiguous(l.format);
  const int64_t C = l.channels;
  const double n = static_cast<double>(l.per_channel());
  // Statistics of half inputs are kept in f32 (accumulate_dtype), as cuDNN and PyTorch keep them.
  const DType stats = accumulate_dtype(x.dtype());
  Tensor mean = empty({C}, stats), var = empty({C}, stats);
  CUDA_DISPATCH_FLOAT(x.dtype(), "bn_mean_var", [&] {
    using stat_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
    const scalar_t* px = static_cast<const scalar_t*>(x.raw_data());
    stat_t* out_mean = static_cast<stat_t*>(mean.raw_data());
    stat_t* out_var = static_cast<stat_t*>(var.raw_data());
    channel_reduce<scalar_t, kMoments>(l, px, nullptr, nullptr, ChannelValues{},
                                       [=] __device__(int64_t c, double s, double q) {
                                         const Moments mo = moments_of(px, c, l.inner, s, q, n);
                                         out_mean[c] = static_cast<stat_t>(mo.mean);
                                         out_var[c] = static_cast<stat_t>(mo.var);
                                       });
  });
  return {mean, var};
}

std::pair<Tensor, Tensor> CudaBackend::bn_train_stats(const Tensor& x_in, double eps, double momentum,
                                                      Tensor& running_mean, Tensor& running_var) {
  using namespace cuda;
  check_device(x_in, "bn_train_stats", "input");
  const ChannelLayout l = channel_layout(x_in, "bn_train_stats");
  if (l.per_channel() == 0)
    throw std::invalid_argument("bn_train_stats: no values per channel in input of shape " +
                                shape_str(x_in.shape()));
  if (running_mean.defined() != running_var.defined())
    throw std::invalid_argument(
        "bn_train_stats: running_mean and running_var must be both defined or neither");
  // train.cudnn_fusion: the convolution that made x summed it already (nn/cuda/conv_stats_fusion.h).
  if (std::optional<ChannelSums> sums = take_channel_sums(x_in))
    return bn_train_stats_from_sums(*sums, x_in.dtype(), eps, momentum, running_mean, running_var);
  const Tensor x = x_in.contiguous(l.format);
  const int64_t C = l.channels;
  const double n = static_cast<double>(l.per_channel());
  const BatchStatsOutputs out =
      batch_stats_outputs("bn_train_stats", C, n, accumulate_dtype(x.dtype()), running_mean, running_var);
  CUDA_DISPATCH_FLOAT(x.dtype(), "bn_train_stats", [&] {
    using stat_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
    const scalar_t* px = static_cast<const scalar_t*>(x.raw_data());
    const StoreBatchStats<stat_t> store = out.store<stat_t>(eps, momentum);
    channel_reduce<scalar_t, kMoments>(l, px, nullptr, nullptr, ChannelValues{},
                                       [=] __device__(int64_t c, double s, double q) {
                                         const Moments mo = moments_of(px, c, l.inner, s, q, n);
                                         store(c, mo.mean, mo.var);
                                       });
  });
  return {out.mean, out.invstd};
}

Tensor CudaBackend::bn_apply(const Tensor& x_in, const Tensor& mean_t, const Tensor& invstd_t,
                             const Tensor& gamma_t, const Tensor& beta_t, const BnEpilogue& epilogue) {
  using namespace cuda;
  check_device(x_in, "bn_apply", "input");
  const ChannelLayout l = channel_layout(x_in, "bn_apply");
  const int64_t C = l.channels;
  Tensor k0, k1, k2, k3;
  const ChannelValues mean = channel_values(mean_t, C, "bn_apply", "mean", false, k0),
                      invstd = channel_values(invstd_t, C, "bn_apply", "invstd", false, k1),
                      gamma = channel_values(gamma_t, C, "bn_apply", "weight", true, k2),
                      beta = channel_values(beta_t, C, "bn_apply", "bias", true, k3);
  const Tensor x = x_in.contiguous(l.format);
  Tensor residual;
  if (epilogue.residual.defined()) {
    check_same(epilogue.residual, x_in, "bn_apply", "residual");
    residual = epilogue.residual.contiguous(l.format);
  }
  Tensor y = empty(x.shape(), x.dtype(), l.format);
  CUDA_DISPATCH_FLOAT(x.dtype(), "bn_apply", [&] {
    channel_affine<scalar_t>(l, x.numel(), static_cast<const scalar_t*>(x.raw_data()),
                             residual.defined() ? static_cast<const scalar_t*>(residual.raw_data()) : nullptr,
                             static_cast<scalar_t*>(y.raw_data()),
                             ForwardCoefficients{mean, invstd, gamma, beta, residual.defined()},
                             epilogue.relu);
  });
  return y;
}

std::pair<Tensor, Tensor> CudaBackend::bn_backward_reduce(const Tensor& grad_y, const Tensor& x_in,
                                                          const Tensor& mean_t, const Tensor& invstd_t,
                                                          const Tensor& relu_out) {
  using namespace cuda;
  check_device(x_in, "bn_backward_reduce", "input");
  const ChannelLayout l = channel_layout(x_in, "bn_backward_reduce");
  check_same(grad_y, x_in, "bn_backward_reduce", "grad_y");
  const int64_t C = l.channels;
  Tensor k0, k1;
  const ChannelValues mean = channel_values(mean_t, C, "bn_backward_reduce", "mean", false, k0),
                      invstd = channel_values(invstd_t, C, "bn_backward_reduce", "invstd", false, k1);
  const Tensor x = x_in.contiguous(l.format), g = grad_y.contiguous(l.format);
  Tensor relu;
  if (relu_out.defined()) {
    check_same(relu_out, x_in, "bn_backward_reduce", "relu_out");
    relu = relu_out.contiguous(l.format);
  }
  const DType stats = accumulate_dtype(x.dtype());  // f32 for half inputs, as in bn_mean_var
  Tensor sum_dy = empty({C}, stats), sum_dy_xhat = empty({C}, stats);
  CUDA_DISPATCH_FLOAT(x.dtype(), "bn_backward_reduce", [&] {
    using stat_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
    stat_t* o0 = static_cast<stat_t*>(sum_dy.raw_data());
    stat_t* o1 = static_cast<stat_t*>(sum_dy_xhat.raw_data());
    channel_reduce<scalar_t, kBackward>(
        l, static_cast<const scalar_t*>(x.raw_data()), static_cast<const scalar_t*>(g.raw_data()),
        relu.defined() ? static_cast<const scalar_t*>(relu.raw_data()) : nullptr, mean,
        [=] __device__(int64_t c, double s0, double s1) {
          o0[c] = static_cast<stat_t>(s0);
          o1[c] = static_cast<stat_t>(s1 * invstd[c]);
        });
  });
  return {sum_dy, sum_dy_xhat};
}

Tensor CudaBackend::bn_backward_input(const Tensor& grad_y, const Tensor& x_in, const Tensor& mean_t,
                                      const Tensor& invstd_t, const Tensor& gamma_t, const Tensor& sum_dy_t,
                                      const Tensor& sum_dy_xhat_t, int64_t count, const Tensor& relu_out) {
  using namespace cuda;
  check_device(x_in, "bn_backward_input", "input");
  const ChannelLayout l = channel_layout(x_in, "bn_backward_input");
  check_same(grad_y, x_in, "bn_backward_input", "grad_y");
  if (count <= 0)
    throw std::invalid_argument("bn_backward_input: count must be positive, got " + std::to_string(count));
  const int64_t C = l.channels;
  const char* op = "bn_backward_input";
  Tensor k0, k1, k2, k3, k4;
  const ChannelValues mean = channel_values(mean_t, C, op, "mean", false, k0),
                      invstd = channel_values(invstd_t, C, op, "invstd", false, k1),
                      gamma = channel_values(gamma_t, C, op, "weight", true, k2),
                      sum_dy = channel_values(sum_dy_t, C, op, "sum_dy", false, k3),
                      sum_dy_xhat = channel_values(sum_dy_xhat_t, C, op, "sum_dy_xhat", false, k4);
  const Tensor x = x_in.contiguous(l.format), g = grad_y.contiguous(l.format);
  Tensor relu;
  if (relu_out.defined()) {
    check_same(relu_out, x_in, op, "relu_out");
    relu = relu_out.contiguous(l.format);
  }
  Tensor gx = empty(x.shape(), x.dtype(), l.format);
  const double n = static_cast<double>(count);
  CUDA_DISPATCH_FLOAT(x.dtype(), op, [&] {
    // As (x - mean) * a + b + dy * s.
    channel_affine<scalar_t>(l, x.numel(), static_cast<const scalar_t*>(x.raw_data()),
                             static_cast<const scalar_t*>(g.raw_data()),
                             static_cast<scalar_t*>(gx.raw_data()),
                             BackwardCoefficients{mean, invstd, gamma, sum_dy, sum_dy_xhat, n}, false,
                             relu.defined() ? static_cast<const scalar_t*>(relu.raw_data()) : nullptr);
  });
  return gx;
}

}  // namespace trainer
