#pragma once
// train.loss as an enum, with its TOML spelling: the classification loss of a training step
// (nn/training_loss.h). A header of its own so that the config layer names it without autograd.
#include <string_view>

namespace trainer {

// cross_entropy: softmax cross-entropy (label-smoothed, against mixed targets with Mixup/CutMix);
// bce: binary cross-entropy with logits on smoothed (mixed) one-hot targets, as ResNet strikes back.
enum class LossKind { cross_entropy, bce };

inline std::string_view loss_kind_name(LossKind kind) {
  return kind == LossKind::bce ? "bce" : "cross_entropy";
}

}  // namespace trainer
