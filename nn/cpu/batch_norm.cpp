// Batch-norm kernels, split like PyTorch's SyncBatchNorm (statistics, apply, backward reduce,
// backward input) so a data-parallel layer can all-reduce the per-channel sums between the pieces.
//
// Layouts: a channels-last [N, C, H, W] input is walked in place as [N*H*W, C]; anything else is made
// contiguous and walked as [N, C, inner] with inner = prod(dims after C) (so [N, C] inputs work too).
// Both are the index (outer * C + c) * inner + i, with inner = 1 for channels-last. Outputs share x's
// layout. Per-channel sums are accumulated in double.
#include <array>
#include <cmath>
#include <utility>
#include <vector>

#include "nn/channel_layout.h"
#include "nn/cpu/cpu_backend.h"
#include "nn/cpu/parallel.h"
#include "nn/cpu/relu_mask.h"

namespace trainer {
namespace {

// Walks layout `l` split over threads, the way both affine kernels below read it: row(o) for a
// channels-last row of C elements (channel c at o * C + c), run(c, base) for a contiguous run of
// l.inner elements of channel c from base. Each kernel writes its loops over a row or a run itself,
// with restrict pointers, so the compiler vectorises them: across channels for channels-last, along
// the channel's run for [N, C, inner].
template <class Row, class Run>
void for_each_channel_block(const ChannelLayout& l, Row&& row, Run&& run) {
  const int64_t C = l.channels, work = l.outer * C * l.inner;
  if (l.inner == 1) {
    cpu::parallel_ranges(
        l.outer, work,
        [&](int64_t o0, int64_t o1) {
          for (int64_t o = o0; o < o1; ++o) row(o);
        },
        1);
    return;
  }
  cpu::parallel_ranges(
      l.outer * C, work,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) run(r % C, r * l.inner);
      },
      1);
}

// BatchNorm's input gradient: out = (x - m[c]) * a[c] + b[c] + g * s[c] for every element in layout `l`;
// when Masked, g counts only where relu_y > 0 (the gradient through a fused ReLU, without a pass that
// writes it out first).
template <bool Masked, class T>
void channel_affine(const ChannelLayout& l, const T* x, const T* g, T* out, const T* m, const T* a,
                    const T* b, const T* s, const T* relu_y = nullptr) {
  const int64_t C = l.channels, n = l.inner;
  for_each_channel_block(
      l,
      [&](int64_t o) {
        const T* __restrict xr = x + o * C;
        const T* __restrict gr = g + o * C;
        T* __restrict yr = out + o * C;
        if constexpr (Masked) {
          const T* __restrict rr = relu_y + o * C;
          for (int64_t c = 0; c < C; ++c)
            yr[c] = (xr[c] - m[c]) * a[c] + b[c] + cpu::relu_mask(rr[c], gr[c]) * s[c];
        } else {
          for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - m[c]) * a[c] + b[c] + gr[c] * s[c];
        }
      },
      [&](int64_t c, int64_t base) {
        const T* __restrict xs = x + base;
        const T* __restrict gs = g + base;
        T* __restrict ys = out + base;
        const T mc = m[c], ac = a[c], bc = b[c], sc = s[c];
        if constexpr (Masked) {
          const T* __restrict rs = relu_y + base;
          for (int64_t i = 0; i < n; ++i) ys[i] = (xs[i] - mc) * ac + bc + cpu::relu_mask(rs[i], gs[i]) * sc;
        } else {
          for (int64_t i = 0; i < n; ++i) ys[i] = (xs[i] - mc) * ac + bc + gs[i] * sc;
        }
      });
}

// BatchNorm's apply with its epilogue in the same pass: out = (x - m[c]) * a[c] + b[c], then + r (the
// residual) when AddResidual, then the ReLU when Relu, per element in that order, as separate passes
// computed it (so bit for bit the same) without writing out and reading back the intermediate.
template <bool AddResidual, bool Relu, class T>
void channel_affine_epilogue(const ChannelLayout& l, const T* x, const T* r, T* out, const T* m, const T* a,
                             const T* b) {
  const int64_t C = l.channels, n = l.inner;
  auto epilogue = [](T v, T residual) {
    if constexpr (AddResidual) v += residual;
    if constexpr (Relu) v = v > T(0) ? v : T(0);
    return v;
  };
  for_each_channel_block(
      l,
      [&](int64_t o) {
        const T* __restrict xr = x + o * C;
        const T* __restrict rr = AddResidual ? r + o * C : nullptr;
        T* __restrict yr = out + o * C;
        for (int64_t c = 0; c < C; ++c)
          yr[c] = epilogue((xr[c] - m[c]) * a[c] + b[c], AddResidual ? rr[c] : T(0));
      },
      [&](int64_t c, int64_t base) {
        const T* __restrict xs = x + base;
        const T* __restrict rs = AddResidual ? r + base : nullptr;
        T* __restrict ys = out + base;
        const T mc = m[c], ac = a[c], bc = b[c];
        for (int64_t i = 0; i < n; ++i) ys[i] = epilogue((xs[i] - mc) * ac + bc, AddResidual ? rs[i] : T(0));
      });
}

// Per-channel sums in double of fn(index, c), which returns std::array<double, K> so that one pass
// over memory feeds K sums. Along a channel's run eight partial sums per quantity, in arrays of their
// own, break the add dependency chain and let the compiler vectorise the loop (cvtps2pd, addpd): with
// four interleaved in one array it stayed scalar, and BatchNorm's backward sums were resnet18-cifar's
// largest kernel of ours (4.8% of the CPU samples, 20 steps). The sums stay in double. Across channels
// (channels-last) each channel's accumulator is independent already. Threads take whole channels, each
// summed in the same order as on one thread, so the sums do not depend on the thread count.
template <size_t K, class Fn>
std::array<std::vector<double>, K> channel_sums(const ChannelLayout& l, Fn&& fn) {
  static_assert(K == 1 || K == 2);
  const int64_t C = l.channels;
  const int64_t work = l.outer * C * l.inner;
  std::array<std::vector<double>, K> acc;
  for (auto& v : acc) v.assign(static_cast<size_t>(C), 0.0);
  double* __restrict a0 = acc[0].data();
  double* __restrict a1 = acc[K - 1].data();
  if (l.inner == 1) {
    // 8 doubles to a cache line: channel ranges that are multiples of 8 keep threads' accumulators apart.
    cpu::parallel_ranges(
        C, work,
        [&](int64_t c0, int64_t c1) {
          for (int64_t o = 0; o < l.outer; ++o)
            for (int64_t c = c0; c < c1; ++c) {
              const std::array<double, K> v = fn(o * C + c, c);
              a0[c] += v[0];
              if constexpr (K == 2) a1[c] += v[1];
            }
        },
        8);
    return acc;
  }
  const int64_t n = l.inner;
  cpu::parallel_ranges(
      C, work,
      [&](int64_t c0, int64_t c1) {
        for (int64_t o = 0; o < l.outer; ++o)
          for (int64_t c = c0; c < c1; ++c) {
            const int64_t base = (o * C + c) * n;
            constexpr int kLanes = 8;
            double p0[kLanes] = {}, p1[kLanes] = {};
            int64_t i = 0;
            for (; i + kLanes <= n; i += kLanes)
              for (int u = 0; u < kLanes; ++u) {
                const std::array<double, K> v = fn(base + i + u, c);
                p0[u] += v[0];
                if constexpr (K == 2) p1[u] += v[1];
              }
            for (int u = 0; i < n; ++i, ++u) {
              const std::array<double, K> v = fn(base + i, c);
              p0[u] += v[0];
              if constexpr (K == 2) p1[u] += v[1];
            }
            auto total = [](const double* p) {
              return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
            };
            a0[c] += total(p0);
            if constexpr (K == 2) a1[c] += total(p1);
          }
      },
      1);
  return acc;
}

// x (or a tensor of x's shape) in the layout chosen for x.
Tensor in_layout(const Tensor& t, const ChannelLayout& l) { return t.contiguous(l.format); }

void check_same(const Tensor& a, const Tensor& x, const char* op, const char* name) {
  if (a.shape() != x.shape())
    throw std::invalid_argument(std::string(op) + ": " + name + " has shape " + shape_str(a.shape()) +
                                ", input has " + shape_str(x.shape()));
  if (a.dtype() != x.dtype())
    throw std::invalid_argument(std::string(op) + ": " + name + " is " + std::string(dtype_name(a.dtype())) +
                                ", input is " + std::string(dtype_name(x.dtype())));
}

// A [C] per-channel tensor as host doubles; `fallback` fills it when the tensor is undefined and
// optional (gamma = 1, beta = 0).
std::vector<double> channel_values(const Tensor& t, int64_t C, const char* op, const char* name,
                                   bool optional, double fallback = 0.0) {
  if (!t.defined()) {
    if (!optional) throw std::invalid_argument(std::string(op) + ": " + name + " is undefined");
    return std::vector<double>(static_cast<size_t>(C), fallback);
  }
  if (t.dim() != 1 || t.size(0) != C)
    throw std::invalid_argument(std::string(op) + ": " + name + " must have shape [" + std::to_string(C) +
                                "], got " + shape_str(t.shape()));
  return t.to_vector<double>();
}

Tensor channel_tensor(const std::vector<double>& values, DType dtype) {
  return Tensor::from_vector(values, {static_cast<int64_t>(values.size())}).to(dtype);
}

}  // namespace

std::pair<Tensor, Tensor> CpuBackend::bn_mean_var(const Tensor& x_in) {
  const ChannelLayout l = channel_layout(x_in, "bn_mean_var");
  if (l.per_channel() == 0)
    throw std::invalid_argument("bn_mean_var: no values per channel in input of shape " +
                                shape_str(x_in.shape()));
  const Tensor x = in_layout(x_in, l);
  const double n = static_cast<double>(l.per_channel());
  std::vector<double> mean, var;
  TRAINER_DISPATCH_FLOAT(x.dtype(), "bn_mean_var", [&] {
    const scalar_t* px = x.data<scalar_t>();
    mean = channel_sums<1>(l, [&](int64_t i, int64_t) { return std::array<double, 1>{double(px[i])}; })[0];
    for (double& m : mean) m /= n;
    // Two passes: the sum of squared deviations does not cancel catastrophically when |mean| >> std.
    var = channel_sums<1>(l, [&](int64_t i, int64_t c) {
      const double d = double(px[i]) - mean[c];
      return std::array<double, 1>{d * d};
    })[0];
    for (double& v : var) v /= n;
  });
  return {channel_tensor(mean, x.dtype()), channel_tensor(var, x.dtype())};
}

std::pair<Tensor, Tensor> CpuBackend::bn_train_stats(const Tensor& x, double eps, double momentum,
                                                     Tensor& running_mean, Tensor& running_var) {
  const auto [mean_t, var_t] = bn_mean_var(x);
  const std::vector<double> mean = mean_t.to_vector<double>(), var = var_t.to_vector<double>();
  // 1 / sqrt(var + eps) in the statistics' dtype, as the separate ops computed it (and PyTorch does).
  std::vector<double> invstd(var.size());
  for (size_t c = 0; c < var.size(); ++c)
    invstd[c] = mean_t.dtype() == DType::f32
                    ? 1.0f / std::sqrt(static_cast<float>(var[c]) + static_cast<float>(eps))
                    : 1.0 / std::sqrt(var[c] + eps);
  if (running_mean.defined() || running_var.defined()) {
    const int64_t C = static_cast<int64_t>(mean.size());
    const double n = static_cast<double>(x.numel() / C);
    auto update = [&](Tensor& running, const std::vector<double>& batch, double factor, const char* name) {
      std::vector<double> r = channel_values(running, C, "bn_train_stats", name, false);
      for (int64_t c = 0; c < C; ++c) r[c] = (1.0 - momentum) * r[c] + momentum * factor * batch[c];
      running.copy_(channel_tensor(r, running.dtype()));
    };
    update(running_mean, mean, 1.0, "running_mean");
    update(running_var, var, n / (n - 1.0), "running_var");
  }
  return {mean_t, channel_tensor(invstd, mean_t.dtype())};
}

Tensor CpuBackend::bn_apply(const Tensor& x_in, const Tensor& mean_t, const Tensor& invstd_t,
                            const Tensor& gamma_t, const Tensor& beta_t, const BnEpilogue& epilogue) {
  const ChannelLayout l = channel_layout(x_in, "bn_apply");
  const int64_t C = l.channels;
  const std::vector<double> mean = channel_values(mean_t, C, "bn_apply", "mean", false);
  const std::vector<double> invstd = channel_values(invstd_t, C, "bn_apply", "invstd", false);
  const std::vector<double> gamma = channel_values(gamma_t, C, "bn_apply", "weight", true, 1.0);
  const std::vector<double> beta = channel_values(beta_t, C, "bn_apply", "bias", true, 0.0);
  const Tensor x = in_layout(x_in, l);
  Tensor residual;
  if (epilogue.residual.defined()) {
    check_same(epilogue.residual, x_in, "bn_apply", "residual");
    residual = in_layout(epilogue.residual, l);
  }
  Tensor y = Tensor::empty(x.shape(), x.dtype(), Device::cpu(), l.format);
  TRAINER_DISPATCH_FLOAT(x.dtype(), "bn_apply", [&] {
    std::vector<scalar_t> m(C), a(C), b(C);
    for (int64_t c = 0; c < C; ++c) {
      m[c] = static_cast<scalar_t>(mean[c]);
      a[c] = static_cast<scalar_t>(invstd[c] * gamma[c]);
      b[c] = static_cast<scalar_t>(beta[c]);
    }
    // (x - mean) * a + b rather than x * a + (b - mean * a): no cancellation when |mean| >> std. The
    // epilogue in the same order as the unfused ops: add the residual, then the ReLU.
    const scalar_t* px = x.data<scalar_t>();
    const scalar_t* pr = residual.defined() ? residual.data<scalar_t>() : nullptr;
    scalar_t* py = y.data<scalar_t>();
    if (pr && epilogue.relu)
      channel_affine_epilogue<true, true>(l, px, pr, py, m.data(), a.data(), b.data());
    else if (pr)
      channel_affine_epilogue<true, false>(l, px, pr, py, m.data(), a.data(), b.data());
    else if (epilogue.relu)
      channel_affine_epilogue<false, true>(l, px, pr, py, m.data(), a.data(), b.data());
    else
      channel_affine_epilogue<false, false>(l, px, pr, py, m.data(), a.data(), b.data());
  });
  return y;
}

std::pair<Tensor, Tensor> CpuBackend::bn_backward_reduce(const Tensor& grad_y_relu, const Tensor& x_in,
                                                         const Tensor& mean_t, const Tensor& invstd_t,
                                                         const Tensor& relu_out) {
  const ChannelLayout l = channel_layout(x_in, "bn_backward_reduce");
  check_same(grad_y_relu, x_in, "bn_backward_reduce", "grad_y");
  if (relu_out.defined()) check_same(relu_out, x_in, "bn_backward_reduce", "relu_out");
  const int64_t C = l.channels;
  const std::vector<double> mean = channel_values(mean_t, C, "bn_backward_reduce", "mean", false);
  const std::vector<double> invstd = channel_values(invstd_t, C, "bn_backward_reduce", "invstd", false);
  const Tensor x = in_layout(x_in, l), g = in_layout(grad_y_relu, l);
  const Tensor y = relu_out.defined() ? in_layout(relu_out, l) : Tensor();
  std::vector<double> sum_dy, sum_dy_xhat;
  TRAINER_DISPATCH_FLOAT(x.dtype(), "bn_backward_reduce", [&] {
    const scalar_t* px = x.data<scalar_t>();
    const scalar_t* pg = g.data<scalar_t>();
    const scalar_t* py = y.defined() ? y.data<scalar_t>() : nullptr;
    auto sums = py ? channel_sums<2>(l,
                                     [&](int64_t i, int64_t c) {
                                       const double dy = cpu::relu_mask(py[i], pg[i]);
                                       return std::array<double, 2>{dy, dy * (double(px[i]) - mean[c])};
                                     })
                   : channel_sums<2>(l, [&](int64_t i, int64_t c) {
                       const double dy = pg[i];
                       return std::array<double, 2>{dy, dy * (double(px[i]) - mean[c])};
                     });
    sum_dy = std::move(sums[0]);
    sum_dy_xhat = std::move(sums[1]);
  });
  for (int64_t c = 0; c < C; ++c) sum_dy_xhat[c] *= invstd[c];
  return {channel_tensor(sum_dy, x.dtype()), channel_tensor(sum_dy_xhat, x.dtype())};
}

Tensor CpuBackend::bn_backward_input(const Tensor& grad_y_relu, const Tensor& x_in, const Tensor& mean_t,
                                     const Tensor& invstd_t, const Tensor& gamma_t, const Tensor& sum_dy_t,
                                     const Tensor& sum_dy_xhat_t, int64_t count, const Tensor& relu_out) {
  const ChannelLayout l = channel_layout(x_in, "bn_backward_input");
  check_same(grad_y_relu, x_in, "bn_backward_input", "grad_y");
  if (relu_out.defined()) check_same(relu_out, x_in, "bn_backward_input", "relu_out");
  if (count <= 0)
    throw std::invalid_argument("bn_backward_input: count must be positive, got " + std::to_string(count));
  const int64_t C = l.channels;
  const std::vector<double> mean = channel_values(mean_t, C, "bn_backward_input", "mean", false);
  const std::vector<double> invstd = channel_values(invstd_t, C, "bn_backward_input", "invstd", false);
  const std::vector<double> gamma = channel_values(gamma_t, C, "bn_backward_input", "weight", true, 1.0);
  const std::vector<double> sum_dy = channel_values(sum_dy_t, C, "bn_backward_input", "sum_dy", false);
  const std::vector<double> sum_dy_xhat =
      channel_values(sum_dy_xhat_t, C, "bn_backward_input", "sum_dy_xhat", false);
  const Tensor x = in_layout(x_in, l), g = in_layout(grad_y_relu, l);
  const Tensor y = relu_out.defined() ? in_layout(relu_out, l) : Tensor();
  Tensor gx = Tensor::empty(x.shape(), x.dtype(), Device::cpu(), l.format);
  TRAINER_DISPATCH_FLOAT(x.dtype(), "bn_backward_input", [&] {
    // grad_x = (dy - mean(dy) - xhat * mean(dy * xhat)) * invstd * gamma with xhat = (x - mean) * invstd,
    // rearranged as (x - mean) * a + b + dy * s for the shared per-channel affine loop.
    std::vector<scalar_t> m(C), a(C), b(C), s(C);
    const double n = static_cast<double>(count);
    for (int64_t c = 0; c < C; ++c) {
      const double scale = invstd[c] * gamma[c];
      m[c] = static_cast<scalar_t>(mean[c]);
      a[c] = static_cast<scalar_t>(-sum_dy_xhat[c] / n * invstd[c] * scale);
      b[c] = static_cast<scalar_t>(-sum_dy[c] / n * scale);
      s[c] = static_cast<scalar_t>(scale);
    }
    if (y.defined())
      channel_affine<true>(l, x.data<scalar_t>(), g.data<scalar_t>(), gx.data<scalar_t>(), m.data(), a.data(),
                           b.data(), s.data(), y.data<scalar_t>());
    else
      channel_affine<false>(l, x.data<scalar_t>(), g.data<scalar_t>(), gx.data<scalar_t>(), m.data(),
                            a.data(), b.data(), s.data());
  });
  return gx;
}

}  // namespace trainer
