#include "nn/training_loss.h"

#include <stdexcept>

#include "nn/backend.h"
#include "nn/functional.h"

namespace trainer {

Tensor training_images(const TrainingLoss& loss, const Tensor& images) {
  if (!loss.mix_images) return images;
  if (!loss.draws) throw std::logic_error("training_images: mixing without draws");
  return backend_for(images).mix_images(images, *loss.draws);
}

Variable training_loss(const TrainingLoss& loss, const Variable& logits, const Tensor& labels) {
  if (!loss.soft_targets()) {
    if (loss.kind != LossKind::cross_entropy) throw std::logic_error("training_loss: bce needs soft targets");
    return F::cross_entropy(logits, labels, loss.label_smoothing);
  }
  if (logits.dim() != 2)
    throw std::invalid_argument("training_loss: logits must be [N, K], got " + shape_str(logits.shape()));
  // f32 targets whatever the logits: the losses compute in f32 under autocast.
  const Tensor targets =
      backend_for(labels).mix_targets(labels, logits.size(1), loss.label_smoothing, *loss.draws, DType::f32);
  return loss.kind == LossKind::bce ? F::bce_with_logits(logits, targets)
                                    : F::soft_cross_entropy(logits, targets);
}

}  // namespace trainer
