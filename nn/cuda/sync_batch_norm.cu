// The synchronised batch norm's pieces (nn/backend.h, dist/sync_batch_norm.cpp) on the GPU. The
// channel reduction that bn_train_stats and bn_backward_reduce run writes this rank's sums straight
// into the f64 buffer that is all-reduced, and one small kernel turns the reduced sums into the
// statistics: per layer, one reduction and one [C] kernel forward, one reduction backward, instead of
// ~20 elementwise kernels on [C] tensors around two f64 packing copies. Counts are read on the
// device, so a layer never waits for the host and a CUDA graph captures it with its all-reduces.
#include <string>
#include <type_traits>

#include "nn/cuda/channel_stats.cuh"
#include "nn/kernel_checks.h"

namespace trainer {
namespace cuda {
namespace {

// `packed`'s values after checking that it is a dense f64 buffer of `numel` values on this GPU.
double* packed_values(const Tensor& packed, int64_t numel, const char* op, const char* name) {
  check_device(packed, op, name);
  if (packed.dtype() != DType::f64 || packed.numel() != numel || !packed.is_contiguous())
    throw std::invalid_argument(std::string(op) + ": " + name + " must be a dense f64 tensor of " +
                                std::to_string(numel) + " values, got " +
                                std::string(dtype_name(packed.dtype())) + " " + shape_str(packed.shape()));
  return static_cast<double*>(packed.raw_data());
}

// Channel c's statistics from packed sums s = [sum x | sum x^2 | n] over every rank, as bn_train_stats
// stores them (mean and biased variance in double; n <= 1 is the caller's error to report).
template <class stat_t>
void store_global_stats(const double* s, int64_t C, StoreBatchStats<stat_t> store) {
  for_each(C, [=] __device__(int64_t c) {
    const double n = s[2 * C];
    const double m = n > 0 ? s[c] / n : 0.0;
    const double var = n > 0 ? fmax(s[C + c] / n - m * m, 0.0) : 0.0;
    StoreBatchStats<stat_t> st = store;
    st.unbias = n > 1 ? n / (n - 1.0) : 1.0;  // n is known only here
    st(c, m, var);
  });
}

}  // namespace
}  // namespace cuda

void CudaBackend::sync_bn_local_stats(const Tensor& x_in, Tensor& packed) {
  using namespace cuda;
  const char* op = "sync_bn_local_stats";
  check_device(x_in, op, "input");
  const ChannelLayout l = channel_layout(x_in, op);
  const int64_t C = l.channels;
  double* out = packed_values(packed, 2 * C + 1, op, "packed");
  if (l.per_channel() == 0) {  // an empty shard: it adds nothing, not even to the count
    packed.zero_();
    return;
  }
  const Tensor x = x_in.contiguous(l.format);
  const double n = static_cast<double>(l.per_channel());
  const int64_t inner = l.inner;
  CUDA_DISPATCH_FLOAT(x.dtype(), op, [&] {
    const scalar_t* px = static_cast<const scalar_t*>(x.raw_data());
    channel_reduce<scalar_t, kMoments>(l, px, nullptr, nullptr, ChannelValues{},
                                       [=] __device__(int64_t c, double s, double q) {
                                         // The reduction's sums are shifted by k, a value of this
                                         // rank's; unshifted, every rank's sums add up.
                                         const double k = moments_shift(px, c, inner);
                                         out[c] = n * k + s;                      // sum x
                                         out[C + c] = q + k * (2.0 * s + n * k);  // sum x^2
                                         if (c == 0) out[2 * C] = n;
                                       });
  });
}

std::pair<Tensor, Tensor> CudaBackend::sync_bn_global_stats(const Tensor& packed, DType stats, double eps,
                                                            double momentum, Tensor& running_mean,
                                                            Tensor& running_var) {
  using namespace cuda;
  const char* op = "sync_bn_global_stats";
  const int64_t C = check_sync_bn_global_stats(packed, stats, running_mean, running_var);
  const double* s = packed_values(packed, 2 * C + 1, op, "packed");
  // n is known only on the device: store_global_stats sets the unbiasing factor there.
  const BatchStatsOutputs out = batch_stats_outputs(op, C, 1.0, stats, running_mean, running_var);
  if (stats == DType::f64)
    store_global_stats(s, C, out.store<double>(eps, momentum));
  else
    store_global_stats(s, C, out.store<float>(eps, momentum));
  return {out.mean, out.invstd};
}

std::pair<Tensor, Tensor> CudaBackend::sync_bn_local_grad_sums(const Tensor& grad_y, const Tensor& x_in,
                                                               const Tensor& mean_t, const Tensor& invstd_t,
                                                               const Tensor& global_stats, Tensor& packed) {
  using namespace cuda;
  const char* op = "sync_bn_local_grad_sums";
  check_device(x_in, op, "input");
  check_device(grad_y, op, "grad_y");
  const ChannelLayout l = channel_layout(x_in, op);
  if (grad_y.shape() != x_in.shape())
    throw std::invalid_argument(std::string(op) + ": grad_y has shape " + shape_str(grad_y.shape()) +
                                ", input has " + shape_str(x_in.shape()));
  check_same_dtype(grad_y, x_in, op);
  const int64_t C = l.channels;
  Tensor k0, k1;
  const ChannelValues mean = channel_values(mean_t, C, op, "mean", false, k0),
                      invstd = channel_values(invstd_t, C, op, "invstd", false, k1);
  const double* global = packed_values(global_stats, 2 * C + 1, op, "global_stats");
  double* out = packed_values(packed, 2 * C, op, "packed");
  const DType stats = accumulate_dtype(x_in.dtype());  // as bn_backward_reduce
  Tensor sum_dy = empty({C}, stats), sum_dy_xhat = empty({C}, stats);
  if (l.per_channel() == 0) {
    packed.zero_();
    sum_dy.zero_();
    sum_dy_xhat.zero_();
    return {sum_dy, sum_dy_xhat};
  }
  const Tensor x = x_in.contiguous(l.format), g = grad_y.contiguous(l.format);
  CUDA_DISPATCH_FLOAT(x.dtype(), op, [&] {
    using stat_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
    stat_t* o0 = static_cast<stat_t*>(sum_dy.raw_data());
    stat_t* o1 = static_cast<stat_t*>(sum_dy_xhat.raw_data());
    channel_reduce<scalar_t, kBackward>(
        l, static_cast<const scalar_t*>(x.raw_data()), static_cast<const scalar_t*>(g.raw_data()), nullptr,
        mean, [=] __device__(int64_t c, double s0, double s1) {
          const double s1_xhat = s1 * invstd[c];
          o0[c] = static_cast<stat_t>(s0);  // bit for bit bn_backward_reduce's
          o1[c] = static_cast<stat_t>(s1_xhat);
          // Divided here by the global count, before the all-reduce: the sum over ranks of
          // s / n is the mean, and nothing is left to do after the collective.
          const double n = global[2 * C];
          out[c] = n > 0 ? s0 / n : 0.0;
          out[C + c] = n > 0 ? s1_xhat / n : 0.0;
        });
  });
  return {sum_dy, sum_dy_xhat};
}

}  // namespace trainer
