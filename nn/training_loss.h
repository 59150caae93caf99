#pragma once
// The loss a training step minimises, from the model's logits and the batch's hard labels: plain
// cross-entropy with label smoothing (torch's CrossEntropyLoss), or, with soft targets, smoothed
// one-hots mixed by the step's Mixup/CutMix draws (timm's mixup_target) under soft-target
// cross-entropy (timm's SoftTargetCrossEntropy) or binary cross-entropy with logits (timm's
// BinaryCrossEntropy, as ResNet strikes back trains). Evaluation never uses this: it keeps hard labels
// and plain cross-entropy.
#include <cstdint>

#include "nn/autograd/variable.h"
#include "nn/loss_kind.h"

namespace trainer {

struct TrainingLoss {
  LossKind kind = LossKind::cross_entropy;
  double label_smoothing = 0.0;
  // The step's draws (BatchMixer::draws(), on the batch's device). Null: hard labels and plain
  // cross-entropy, which only kind = cross_entropy without mixing allows.
  const Tensor* draws = nullptr;
  bool mix_images = false;  // Mixup/CutMix the images with the draws (else lambda stays 1)
  bool soft_targets() const { return draws != nullptr; }
};

// The images the model sees: mixed with the draws when loss.mix_images, else `images` itself.
Tensor training_images(const TrainingLoss& loss, const Tensor& images);

// The mean loss over the batch. logits [N, K], labels i64 [N] on the logits' device.
Variable training_loss(const TrainingLoss& loss, const Variable& logits, const Tensor& labels);

}  // namespace trainer
