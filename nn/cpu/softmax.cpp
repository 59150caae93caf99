// Softmax over the last dimension on the CPU, whole rows to a thread: the row's maximum is subtracted
// before exp (no overflow for large logits), and the sums are accumulated in double.
#include <algorithm>
#include <cmath>

#include "nn/cpu/cpu_backend.h"
#include "nn/cpu/parallel.h"
#include "nn/kernel_checks.h"

namespace trainer {

Tensor CpuBackend::softmax(const Tensor& x_in) {
  const int64_t n = check_softmax(x_in, "softmax");
  const Tensor x = x_in.contiguous();
  Tensor y = Tensor::empty(x.shape(), x.dtype());
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  TRAINER_DISPATCH_FLOAT(x.dtype(), "softmax", [&] {
    const scalar_t* px = x.data<scalar_t>();
    scalar_t* py = y.data<scalar_t>();
    cpu::parallel_ranges(
        rows, rows * n,
        [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) {
            const scalar_t* xr = px + r * n;
            scalar_t* yr = py + r * n;
            double max = xr[0];
            for (int64_t c = 1; c < n; ++c) max = xr[c] > max ? xr[c] : max;
            double sum = 0.0;
            for (int64_t c = 0; c < n; ++c) sum += std::exp(xr[c] - max);
            const double inv = 1.0 / sum;
            for (int64_t c = 0; c < n; ++c) yr[c] = static_cast<scalar_t>(std::exp(xr[c] - max) * inv);
          }
        },
        1);
  });
  return y;
}

Tensor CpuBackend::softmax_backward(const Tensor& grad_y, const Tensor& y_in) {
  const int64_t n = check_softmax_backward(grad_y, y_in, "softmax_backward");
  const Tensor dy = grad_y.contiguous(), y = y_in.contiguous();
  Tensor dx = Tensor::empty(y.shape(), y.dtype());
  const int64_t rows = n == 0 ? 0 : y.numel() / n;
  TRAINER_DISPATCH_FLOAT(y.dtype(), "softmax_backward", [&] {
    const scalar_t *pdy = dy.data<scalar_t>(), *py = y.data<scalar_t>();
    scalar_t* pdx = dx.data<scalar_t>();
    cpu::parallel_ranges(
        rows, rows * n,
        [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) {
            const scalar_t *dyr = pdy + r * n, *yr = py + r * n;
            double dot = 0.0;
            for (int64_t c = 0; c < n; ++c) dot += static_cast<double>(dyr[c]) * yr[c];
            for (int64_t c = 0; c < n; ++c) pdx[r * n + c] = static_cast<scalar_t>(yr[c] * (dyr[c] - dot));
          }
        },
        1);
  });
  return dx;
}

}  // namespace trainer
