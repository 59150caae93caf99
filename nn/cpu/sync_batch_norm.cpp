// The synchronised batch norm's pieces (nn/backend.h, dist/sync_batch_norm.cpp) on the CPU: this
// rank's per-channel sums in double straight into the f64 buffer that is all-reduced, and the
// statistics from the reduced sums, rounded as bn_train_stats rounds them.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "nn/channel_layout.h"
#include "nn/cpu/cpu_backend.h"
#include "nn/kernel_checks.h"

namespace trainer {
namespace {

// `packed`'s values after checking that it is a dense f64 buffer of `numel` values on the CPU.
double* packed_values(const Tensor& packed, int64_t numel, const char* op, const char* name) {
  if (!packed.defined() || !packed.device().is_cpu() || packed.dtype() != DType::f64 ||
      packed.numel() != numel || !packed.is_contiguous())
    throw std::invalid_argument(std::string(op) + ": " + name + " must be a dense f64 CPU tensor of " +
                                std::to_string(numel) + " values, got " +
                                (packed.defined() ? packed.str() : std::string("undefined")));
  return packed.data<double>();
}

// A [C] per-channel tensor as host doubles.
std::vector<double> channel_doubles(const Tensor& t, int64_t C, const char* op, const char* name) {
  if (!t.defined() || t.dim() != 1 || t.size(0) != C)
    throw std::invalid_argument(std::string(op) + ": " + name + " must have shape [" + std::to_string(C) +
                                "], got " + (t.defined() ? shape_str(t.shape()) : std::string("undefined")));
  return t.to_vector<double>();
}

// s0[c] += sum of a, s1[c] += sum of b over channel c's elements, {a, b} = fn(index, c), in double.
// Along a channel's run four partial sums break the add dependency chain; across channels
// (channels-last) each channel's accumulator is independent already.
template <class Fn>
void add_channel_sums(const ChannelLayout& l, double* __restrict s0, double* __restrict s1, Fn&& fn) {
  const int64_t C = l.channels, n = l.inner;
  if (n == 1) {
    for (int64_t o = 0; o < l.outer; ++o)
      for (int64_t c = 0; c < C; ++c) {
        const auto [a, b] = fn(o * C + c, c);
        s0[c] += a;
        s1[c] += b;
      }
    return;
  }
  for (int64_t o = 0; o < l.outer; ++o)
    for (int64_t c = 0; c < C; ++c) {
      const int64_t base = (o * C + c) * n;
      double a[4] = {0, 0, 0, 0}, b[4] = {0, 0, 0, 0};
      int64_t i = 0;
      for (; i + 4 <= n; i += 4)
        for (int u = 0; u < 4; ++u) {
          const auto [x, y] = fn(base + i + u, c);
          a[u] += x;
          b[u] += y;
        }
      for (; i < n; ++i) {
        const auto [x, y] = fn(base + i, c);
        a[0] += x;
        b[0] += y;
      }
      s0[c] += (a[0] + a[1]) + (a[2] + a[3]);
      s1[c] += (b[0] + b[1]) + (b[2] + b[3]);
    }
}

Tensor channel_tensor(const std::vector<double>& values, DType dtype) {
  return Tensor::from_vector(values, {static_cast<int64_t>(values.size())}).to(dtype);
}

}  // namespace

void CpuBackend::sync_bn_local_stats(const Tensor& x_in, Tensor& packed) {
  const char* op = "sync_bn_local_stats";
  const ChannelLayout l = channel_layout(x_in, op);
  const int64_t C = l.channels;
  double* out = packed_values(packed, 2 * C + 1, op, "packed");
  std::fill(out, out + 2 * C + 1, 0.0);
  const Tensor x = x_in.contiguous(l.format);
  TRAINER_DISPATCH_FLOAT(x.dtype(), op, [&] {
    const scalar_t* px = x.data<scalar_t>();
    add_channel_sums(l, out, out + C, [px](int64_t i, int64_t) {
      const double v = px[i];
      return std::pair<double, double>{v, v * v};
    });
  });
  out[2 * C] = static_cast<double>(l.per_channel());
}

std::pair<Tensor, Tensor> CpuBackend::sync_bn_global_stats(const Tensor& packed, DType stats, double eps,
                                                           double momentum, Tensor& running_mean,
                                                           Tensor& running_var) {
  const char* op = "sync_bn_global_stats";
  const int64_t C = check_sync_bn_global_stats(packed, stats, running_mean, running_var);
  const double* s = packed_values(packed, 2 * C + 1, op, "packed");
  const double n = s[2 * C];
  std::vector<double> mean(C), var(C), invstd(C);
  for (int64_t c = 0; c < C; ++c) {
    // n <= 1 is the caller's error to report; it must not divide by zero here.
    mean[c] = n > 0 ? s[c] / n : 0.0;
    var[c] = n > 0 ? std::max(s[C + c] / n - mean[c] * mean[c], 0.0) : 0.0;
    // 1 / sqrt(var + eps) in the statistics' dtype, as bn_train_stats computes it.
    invstd[c] = stats == DType::f32 ? 1.0f / std::sqrt(static_cast<float>(var[c]) + static_cast<float>(eps))
                                    : 1.0 / std::sqrt(var[c] + eps);
  }
  if (running_mean.defined()) {
    auto update = [&](Tensor& running, const std::vector<double>& batch, double factor, const char* name) {
      std::vector<double> r = channel_doubles(running, C, op, name);
      for (int64_t c = 0; c < C; ++c) r[c] = (1.0 - momentum) * r[c] + momentum * factor * batch[c];
      running.copy_(channel_tensor(r, running.dtype()));
    };
    update(running_mean, mean, 1.0, "running_mean");
    update(running_var, var, n > 1 ? n / (n - 1.0) : 1.0, "running_var");
  }
  return {channel_tensor(mean, stats), channel_tensor(invstd, stats)};
}

std::pair<Tensor, Tensor> CpuBackend::sync_bn_local_grad_sums(const Tensor& grad_y, const Tensor& x_in,
                                                              const Tensor& mean_t, const Tensor& invstd_t,
                                                              const Tensor& global_stats, Tensor& packed) {
  const char* op = "sync_bn_local_grad_sums";
  const ChannelLayout l = channel_layout(x_in, op);
  if (grad_y.shape() != x_in.shape() || grad_y.dtype() != x_in.dtype())
    throw std::invalid_argument(std::string(op) + ": grad_y is " + grad_y.str() + ", input is " + x_in.str());
  const int64_t C = l.channels;
  const std::vector<double> mean = channel_doubles(mean_t, C, op, "mean");
  const std::vector<double> invstd = channel_doubles(invstd_t, C, op, "invstd");
  const double n = packed_values(global_stats, 2 * C + 1, op, "global_stats")[2 * C];
  double* out = packed_values(packed, 2 * C, op, "packed");
  std::fill(out, out + 2 * C, 0.0);
  const Tensor x = x_in.contiguous(l.format), g = grad_y.contiguous(l.format);
  TRAINER_DISPATCH_FLOAT(x.dtype(), op, [&] {
    const scalar_t* px = x.data<scalar_t>();
    const scalar_t* pg = g.data<scalar_t>();
    const double* pm = mean.data();
    add_channel_sums(l, out, out + C, [px, pg, pm](int64_t i, int64_t c) {
      const double dy = pg[i];
      return std::pair<double, double>{dy, dy * (double(px[i]) - pm[c])};
    });
  });
  std::vector<double> sum_dy(out, out + C), sum_dy_xhat(C);
  for (int64_t c = 0; c < C; ++c) {
    sum_dy_xhat[c] = out[C + c] * invstd[c];
    // Divided by the global count before the all-reduce: summed over ranks, these are the means.
    out[c] = n > 0 ? out[c] / n : 0.0;
    out[C + c] = n > 0 ? sum_dy_xhat[c] / n : 0.0;
  }
  const DType stats = accumulate_dtype(x.dtype());  // as bn_backward_reduce
  return {channel_tensor(sum_dy, stats), channel_tensor(sum_dy_xhat, stats)};
}

}  // namespace trainer
