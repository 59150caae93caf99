// Losses against soft targets (a distribution per row: smoothed, mixed one-hots) on the CPU, one row at
// a time with its sums in double: cross-entropy via a fused log-softmax, and binary cross-entropy with
// logits in the overflow-free form max(x, 0) - x t + log1p(exp(-|x|)).
#include <algorithm>
#include <cmath>
#include <vector>

#include "nn/cpu/cpu_backend.h"
#include "nn/soft_target_checks.h"

namespace trainer {

std::pair<Tensor, Tensor> CpuBackend::soft_cross_entropy(const Tensor& logits_in, const Tensor& targets_in) {
  const int64_t K = check_soft_targets(logits_in, targets_in, "soft_cross_entropy");
  const int64_t N = logits_in.size(0);
  const Tensor logits = logits_in.contiguous();
  const Tensor targets = targets_in.to(logits.dtype()).contiguous();
  Tensor loss = Tensor::empty({N}, logits.dtype());
  Tensor probs = Tensor::empty({N, K}, logits.dtype());
  TRAINER_DISPATCH_FLOAT(logits.dtype(), "soft_cross_entropy", [&] {
    const scalar_t* px = logits.data<scalar_t>();
    const scalar_t* pt = targets.data<scalar_t>();
    scalar_t* pl = loss.data<scalar_t>();
    scalar_t* pp = probs.data<scalar_t>();
    for (int64_t i = 0; i < N; ++i) {
      const scalar_t* row = px + i * K;
      const scalar_t* t = pt + i * K;
      double m = row[0];
      for (int64_t k = 1; k < K; ++k)
        if (row[k] > m || std::isnan(static_cast<double>(row[k]))) m = row[k];
      double sum_exp = 0.0;
      for (int64_t k = 0; k < K; ++k) sum_exp += std::exp(static_cast<double>(row[k]) - m);
      const double lse = m + std::log(sum_exp);
      // -sum_k t_k log p_k with log p_k = x_k - lse.
      double l = 0.0;
      for (int64_t k = 0; k < K; ++k) l += static_cast<double>(t[k]) * (lse - static_cast<double>(row[k]));
      pl[i] = static_cast<scalar_t>(l);
      for (int64_t k = 0; k < K; ++k)
        pp[i * K + k] = static_cast<scalar_t>(std::exp(static_cast<double>(row[k]) - lse));
    }
  });
  return {loss, probs};
}

Tensor CpuBackend::soft_cross_entropy_backward(const Tensor& grad_loss, const Tensor& probs_in,
                                               const Tensor& targets_in) {
  const int64_t K = check_soft_targets(probs_in, targets_in, "soft_cross_entropy_backward");
  const int64_t N = probs_in.size(0);
  check_loss_weights(grad_loss, N, "soft_cross_entropy_backward");
  const Tensor probs = probs_in.contiguous();
  const Tensor targets = targets_in.to(probs.dtype()).contiguous();
  const std::vector<double> w = grad_loss.to_vector<double>();
  Tensor grad = Tensor::empty({N, K}, probs.dtype());
  TRAINER_DISPATCH_FLOAT(probs.dtype(), "soft_cross_entropy_backward", [&] {
    const scalar_t* pp = probs.data<scalar_t>();
    const scalar_t* pt = targets.data<scalar_t>();
    scalar_t* pg = grad.data<scalar_t>();
    for (int64_t i = 0; i < N; ++i) {
      // d/dx_k of -sum_j t_j (x_j - lse) = p_k * sum_j t_j - t_k (sum_j t_j = 1 for a distribution).
      double mass = 0.0;
      for (int64_t k = 0; k < K; ++k) mass += static_cast<double>(pt[i * K + k]);
      for (int64_t k = 0; k < K; ++k)
        pg[i * K + k] = static_cast<scalar_t>(
            w[i] * (static_cast<double>(pp[i * K + k]) * mass - static_cast<double>(pt[i * K + k])));
    }
  });
  return grad;
}

Tensor CpuBackend::bce_with_logits(const Tensor& logits_in, const Tensor& targets_in) {
  const int64_t K = check_soft_targets(logits_in, targets_in, "bce_with_logits");
  const int64_t N = logits_in.size(0);
  const Tensor logits = logits_in.contiguous();
  const Tensor targets = targets_in.to(logits.dtype()).contiguous();
  Tensor loss = Tensor::empty({N}, logits.dtype());
  TRAINER_DISPATCH_FLOAT(logits.dtype(), "bce_with_logits", [&] {
    const scalar_t* px = logits.data<scalar_t>();
    const scalar_t* pt = targets.data<scalar_t>();
    scalar_t* pl = loss.data<scalar_t>();
    for (int64_t i = 0; i < N; ++i) {
      double sum = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double x = px[i * K + k], t = pt[i * K + k];
        sum += std::max(x, 0.0) - x * t + std::log1p(std::exp(-std::abs(x)));
      }
      pl[i] = static_cast<scalar_t>(sum / static_cast<double>(K));
    }
  });
  return loss;
}

Tensor CpuBackend::bce_with_logits_backward(const Tensor& grad_loss, const Tensor& logits_in,
                                            const Tensor& targets_in) {
  const int64_t K = check_soft_targets(logits_in, targets_in, "bce_with_logits_backward");
  const int64_t N = logits_in.size(0);
  check_loss_weights(grad_loss, N, "bce_with_logits_backward");
  const Tensor logits = logits_in.contiguous();
  const Tensor targets = targets_in.to(logits.dtype()).contiguous();
  const std::vector<double> w = grad_loss.to_vector<double>();
  Tensor grad = Tensor::empty({N, K}, logits.dtype());
  TRAINER_DISPATCH_FLOAT(logits.dtype(), "bce_with_logits_backward", [&] {
    const scalar_t* px = logits.data<scalar_t>();
    const scalar_t* pt = targets.data<scalar_t>();
    scalar_t* pg = grad.data<scalar_t>();
    const double inv_k = 1.0 / static_cast<double>(K);
    for (int64_t i = 0; i < N * K; ++i) {
      const double sigmoid = 1.0 / (1.0 + std::exp(-static_cast<double>(px[i])));
      pg[i] = static_cast<scalar_t>(w[i / K] * (sigmoid - static_cast<double>(pt[i])) * inv_k);
    }
  });
  return grad;
}

}  // namespace trainer
