#include "nn/soft_target_checks.h"

#include <stdexcept>
#include <string>

#include "nn/batch_mix_math.h"
#include "nn/kernel_checks.h"

namespace trainer {
namespace {

[[noreturn]] void fail(const char* op, const std::string& what) {
  throw std::invalid_argument(std::string(op) + ": " + what);
}

}  // namespace

int64_t check_soft_targets(const Tensor& logits, const Tensor& targets, const char* op) {
  const int64_t K = check_logits(logits, op);
  if (targets.shape() != logits.shape())
    fail(op, "targets must have the logits' shape " + shape_str(logits.shape()) + ", got " +
                 shape_str(targets.shape()));
  if (!is_floating(logits.dtype()) || !is_floating(targets.dtype()))
    fail(op, "logits and targets must be floating, got " + std::string(dtype_name(logits.dtype())) + " and " +
                 std::string(dtype_name(targets.dtype())));
  if (targets.device() != logits.device())
    fail(op, "targets are on " + targets.device().str() + ", logits on " + logits.device().str());
  return K;
}

void check_loss_weights(const Tensor& grad_loss, int64_t n, const char* op) {
  if (grad_loss.dim() != 1 || grad_loss.size(0) != n)
    fail(op, "grad_loss must have shape [" + std::to_string(n) + "], got " + shape_str(grad_loss.shape()));
}

void check_mix_draws(const Tensor& draws, Device device, const char* op) {
  if (draws.dtype() != DType::f64 || draws.dim() != 1 || draws.size(0) != kMixDrawValues ||
      draws.device() != device)
    fail(op, "draws must be f64 [" + std::to_string(kMixDrawValues) + "] on " + device.str() + ", got " +
                 std::string(dtype_name(draws.dtype())) + " " + shape_str(draws.shape()) + " on " +
                 draws.device().str());
}

void check_mix_images(const Tensor& images, const Tensor& draws, const char* op) {
  if (images.dim() != 4) fail(op, "images must be [N, C, H, W], got " + shape_str(images.shape()));
  if (!is_floating(images.dtype()))
    fail(op, "images must be floating, got " + std::string(dtype_name(images.dtype())));
  check_mix_draws(draws, images.device(), op);
}

void check_mix_targets(const Tensor& labels, int64_t classes, double label_smoothing, const Tensor& draws,
                       DType dtype, const char* op) {
  if (labels.dtype() != DType::i64 || labels.dim() != 1)
    fail(op, "labels must be i64 [N], got " + std::string(dtype_name(labels.dtype())) + " " +
                 shape_str(labels.shape()));
  if (classes < 1) fail(op, "classes must be at least 1, got " + std::to_string(classes));
  if (!(label_smoothing >= 0.0 && label_smoothing < 1.0))
    fail(op, "label_smoothing must be in [0, 1), got " + std::to_string(label_smoothing));
  if (!is_floating(dtype)) fail(op, "targets must be floating, got " + std::string(dtype_name(dtype)));
  check_mix_draws(draws, labels.device(), op);
}

}  // namespace trainer
