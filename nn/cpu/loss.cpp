// Classification loss and metrics: fused log-softmax cross-entropy with label smoothing, its
// gradient, top-k hits and argmax. Row reductions are accumulated in double.
#include <cmath>
#include <limits>
#include <vector>

#include "nn/cpu/cpu_backend.h"
#include "nn/kernel_checks.h"

namespace trainer {
namespace {

}  // namespace

std::pair<Tensor, Tensor> CpuBackend::cross_entropy(const Tensor& logits_in, const Tensor& targets_in,
                                                    double label_smoothing) {
  const int64_t K = check_logits(logits_in, "cross_entropy");
  const int64_t N = logits_in.size(0);
  check_label_smoothing(label_smoothing, "cross_entropy");
  const Tensor targets = host_targets_in_range(targets_in, N, K, "cross_entropy");
  const Tensor logits = logits_in.contiguous();
  Tensor loss = Tensor::empty({N}, logits.dtype());
  Tensor probs = Tensor::empty({N, K}, logits.dtype());
  const int64_t* pt = targets.data<int64_t>();
  const double eps = label_smoothing;
  TRAINER_DISPATCH_FLOAT(logits.dtype(), "cross_entropy", [&] {
    const scalar_t* px = logits.data<scalar_t>();
    scalar_t* pl = loss.data<scalar_t>();
    scalar_t* pp = probs.data<scalar_t>();
    for (int64_t i = 0; i < N; ++i) {
      const scalar_t* row = px + i * K;
      // Subtracting the row max keeps exp() in range; a NaN anywhere makes the max, and so the row, NaN.
      double m = row[0];
      for (int64_t k = 1; k < K; ++k)
        if (row[k] > m || std::isnan(static_cast<double>(row[k]))) m = row[k];
      double sum_exp = 0.0, sum_logits = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        sum_exp += std::exp(static_cast<double>(row[k]) - m);
        sum_logits += row[k];
      }
      const double lse = m + std::log(sum_exp);
      // -log p_k = lse - x_k, so mean_k(-log p_k) = lse - mean_k(x_k).
      double l = (1.0 - eps) * (lse - static_cast<double>(row[pt[i]]));
      if (eps > 0.0) l += eps * (lse - sum_logits / static_cast<double>(K));
      pl[i] = static_cast<scalar_t>(l);
      for (int64_t k = 0; k < K; ++k)
        pp[i * K + k] = static_cast<scalar_t>(std::exp(static_cast<double>(row[k]) - lse));
    }
  });
  return {loss, probs};
}

Tensor CpuBackend::cross_entropy_backward(const Tensor& grad_loss, const Tensor& probs_in,
                                          const Tensor& targets_in, double label_smoothing) {
  const int64_t K = check_logits(probs_in, "cross_entropy_backward");
  const int64_t N = probs_in.size(0);
  check_label_smoothing(label_smoothing, "cross_entropy_backward");
  if (grad_loss.dim() != 1 || grad_loss.size(0) != N)
    throw std::invalid_argument("cross_entropy_backward: grad_loss must have shape [" + std::to_string(N) +
                                "], got " + shape_str(grad_loss.shape()));
  const Tensor targets = host_targets_in_range(targets_in, N, K, "cross_entropy_backward");
  const Tensor probs = probs_in.contiguous();
  const std::vector<double> w = grad_loss.to_vector<double>();
  const int64_t* pt = targets.data<int64_t>();
  Tensor grad = Tensor::empty({N, K}, probs.dtype());
  // d loss_i / d x_ik = p_ik - q_ik with the smoothed target q = (1 - eps) onehot + eps / K.
  const double off = label_smoothing / static_cast<double>(K);
  const double on = 1.0 - label_smoothing + off;
  TRAINER_DISPATCH_FLOAT(probs.dtype(), "cross_entropy_backward", [&] {
    const scalar_t* pp = probs.data<scalar_t>();
    scalar_t* pg = grad.data<scalar_t>();
    for (int64_t i = 0; i < N; ++i) {
      const double wi = w[i];
      for (int64_t k = 0; k < K; ++k)
        pg[i * K + k] = static_cast<scalar_t>(wi * (static_cast<double>(pp[i * K + k]) - off));
      pg[i * K + pt[i]] = static_cast<scalar_t>(wi * (static_cast<double>(pp[i * K + pt[i]]) - on));
    }
  });
  return grad;
}

Tensor CpuBackend::topk_correct(const Tensor& logits_in, const Tensor& targets_in, int k) {
  const int64_t K = check_logits(logits_in, "topk_correct");
  const int64_t N = logits_in.size(0);
  if (k < 1) throw std::invalid_argument("topk_correct: k must be at least 1, got " + std::to_string(k));
  const Tensor targets = host_targets_in_range(targets_in, N, K, "topk_correct");
  const Tensor logits = logits_in.contiguous();
  const int64_t* pt = targets.data<int64_t>();
  Tensor out = Tensor::empty({N}, DType::u8);
  uint8_t* po = out.data<uint8_t>();
  TRAINER_DISPATCH_FLOAT(logits.dtype(), "topk_correct", [&] {
    const scalar_t* px = logits.data<scalar_t>();
    for (int64_t i = 0; i < N; ++i) {
      const scalar_t* row = px + i * K;
      const scalar_t t = row[pt[i]];
      // A NaN target logit is never a hit; other NaNs rank above every number, as in torch.topk.
      if (std::isnan(t)) {
        po[i] = 0;
        continue;
      }
      // Ties favour the target: it is in the top k when fewer than k logits are strictly greater.
      int64_t greater = 0;
      for (int64_t j = 0; j < K; ++j) greater += (row[j] > t || std::isnan(row[j])) ? 1 : 0;
      po[i] = greater < k ? 1 : 0;
    }
  });
  return out;
}

Tensor CpuBackend::argmax(const Tensor& logits_in) {
  const int64_t K = check_logits(logits_in, "argmax");
  const int64_t N = logits_in.size(0);
  const Tensor logits = logits_in.contiguous();
  Tensor out = Tensor::empty({N}, DType::i64);
  int64_t* po = out.data<int64_t>();
  TRAINER_DISPATCH_FLOAT(logits.dtype(), "argmax", [&] {
    const scalar_t* px = logits.data<scalar_t>();
    for (int64_t i = 0; i < N; ++i) {
      const scalar_t* row = px + i * K;
      // First index of the maximum; the first NaN wins, as in torch.argmax.
      int64_t best = 0;
      for (int64_t j = 1; j < K && !std::isnan(row[best]); ++j)
        if (row[j] > row[best] || std::isnan(row[j])) best = j;
      po[i] = best;
    }
  });
  return out;
}

}  // namespace trainer
