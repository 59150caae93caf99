// Layer norm on the CPU: each row of x's memory (Backend::layer_norm's [rows, normalized_size]) is
// normalised by its own mean and variance, whole rows to a thread. Sums are accumulated in double, f32
// inputs too, and the variance is a second pass over the row, so a mean far from zero cancels nothing.
// A half y_dtype beside an f32 x is the f32 result rounded once more, as PyTorch's autocast rounds
// layer_norm's f32 output for the matmul that follows; a half grad_y is widened to x's dtype first.
#include <cmath>
#include <vector>

#include "nn/cpu/cpu_backend.h"
#include "nn/cpu/parallel.h"
#include "nn/kernel_checks.h"

namespace trainer {
namespace {

// gamma or beta in x's dtype (f32 and f64 are their own accumulate dtypes), or undefined.
Tensor as_x_dtype(const Tensor& t, DType dtype) { return t.defined() ? t.to(dtype).contiguous() : Tensor(); }

template <class T>
const T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

}  // namespace

LayerNormForward CpuBackend::layer_norm(const Tensor& x, int64_t normalized_size, const Tensor& gamma,
                                        const Tensor& beta, double eps, DType y_dtype) {
  const int64_t rows = check_layer_norm(x, normalized_size, gamma, beta, "layer_norm");
  check_layer_norm_output_dtype(y_dtype, x.dtype(), "layer_norm");
  const int64_t C = normalized_size;
  const DType stats = accumulate_dtype(x.dtype());
  LayerNormForward out{Tensor::empty(x.shape(), x.dtype(), Device::cpu(), x.suggest_memory_format()),
                       Tensor::empty({rows}, stats), Tensor::empty({rows}, stats)};
  const Tensor g = as_x_dtype(gamma, x.dtype()), b = as_x_dtype(beta, x.dtype());
  TRAINER_DISPATCH_FLOAT(x.dtype(), "layer_norm", [&] {
    const scalar_t* px = x.data<scalar_t>();
    const scalar_t *pg = data_or_null<scalar_t>(g), *pb = data_or_null<scalar_t>(b);
    scalar_t *py = out.y.data<scalar_t>(), *pmean = out.mean.data<scalar_t>(),
             *prstd = out.rstd.data<scalar_t>();
    cpu::parallel_ranges(
        rows, rows * C,
        [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) {
            const scalar_t* xr = px + r * C;
            scalar_t* yr = py + r * C;
            double sum = 0.0;
            for (int64_t c = 0; c < C; ++c) sum += xr[c];
            const double mean = sum / static_cast<double>(C);
            double squares = 0.0;
            for (int64_t c = 0; c < C; ++c) squares += (xr[c] - mean) * (xr[c] - mean);
            const double rstd = 1.0 / std::sqrt(squares / static_cast<double>(C) + eps);
            pmean[r] = static_cast<scalar_t>(mean);
            prstd[r] = static_cast<scalar_t>(rstd);
            for (int64_t c = 0; c < C; ++c) {
              const double xhat = (xr[c] - mean) * rstd;
              yr[c] = static_cast<scalar_t>(pg ? xhat * pg[c] + (pb ? pb[c] : 0.0) : xhat);
            }
          }
        },
        1);
  });
  if (y_dtype != x.dtype()) out.y = out.y.to(y_dtype);
  return out;
}

LayerNormGrads CpuBackend::layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean,
                                               const Tensor& rstd, const Tensor& gamma) {
  const int64_t C = check_layer_norm_backward(grad_y, x, mean, rstd, gamma, "layer_norm_backward");
  const int64_t rows = mean.numel();
  const MemoryFormat format = x.suggest_memory_format();
  const Tensor dy = grad_y.to(x.dtype()).contiguous(format);  // read as x is: row r at r * C
  const Tensor g = as_x_dtype(gamma, x.dtype());
  LayerNormGrads out;
  out.grad_x = Tensor::empty(x.shape(), x.dtype(), Device::cpu(), format);
  if (gamma.defined())  // zeros: an input without rows has zero weight and bias gradients
    out.grad_gamma = Tensor::zeros({C}, x.dtype()), out.grad_beta = Tensor::zeros({C}, x.dtype());
  TRAINER_DISPATCH_FLOAT(x.dtype(), "layer_norm_backward", [&] {
    const scalar_t *px = x.data<scalar_t>(), *pdy = dy.data<scalar_t>(), *pg = data_or_null<scalar_t>(g);
    const scalar_t *pmean = mean.data<scalar_t>(), *prstd = rstd.data<scalar_t>();
    scalar_t* pdx = out.grad_x.data<scalar_t>();
    // grad_x = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * gamma, per row.
    cpu::parallel_ranges(
        rows, rows * C,
        [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) {
            const scalar_t *xr = px + r * C, *dyr = pdy + r * C;
            const double m = pmean[r], s = prstd[r];
            double sum_dxhat = 0.0, sum_dxhat_xhat = 0.0;
            for (int64_t c = 0; c < C; ++c) {
              const double dxhat = pg ? static_cast<double>(dyr[c]) * pg[c] : dyr[c];
              sum_dxhat += dxhat;
              sum_dxhat_xhat += dxhat * (xr[c] - m) * s;
            }
            const double mean_dxhat = sum_dxhat / static_cast<double>(C),
                         mean_dxhat_xhat = sum_dxhat_xhat / static_cast<double>(C);
            for (int64_t c = 0; c < C; ++c) {
              const double dxhat = pg ? static_cast<double>(dyr[c]) * pg[c] : dyr[c];
              pdx[r * C + c] =
                  static_cast<scalar_t>(s * (dxhat - mean_dxhat - (xr[c] - m) * s * mean_dxhat_xhat));
            }
          }
        },
        1);
    if (!pg) return;
    // Column sums over every row, a range of columns to a thread: each sum in one fixed order.
    scalar_t *pgg = out.grad_gamma.data<scalar_t>(), *pgb = out.grad_beta.data<scalar_t>();
    cpu::parallel_ranges(C, rows * C, [&](int64_t c0, int64_t c1) {
      std::vector<double> dgamma(static_cast<size_t>(c1 - c0), 0.0), dbeta(dgamma.size(), 0.0);
      for (int64_t r = 0; r < rows; ++r) {
        const double m = pmean[r], s = prstd[r];
        for (int64_t c = c0; c < c1; ++c) {
          const double d = pdy[r * C + c];
          dgamma[static_cast<size_t>(c - c0)] += d * (px[r * C + c] - m) * s;
          dbeta[static_cast<size_t>(c - c0)] += d;
        }
      }
      for (int64_t c = c0; c < c1; ++c) {
        pgg[c] = static_cast<scalar_t>(dgamma[static_cast<size_t>(c - c0)]);
        pgb[c] = static_cast<scalar_t>(dbeta[static_cast<size_t>(c - c0)]);
      }
    });
  });
  return out;
}

}  // namespace trainer
