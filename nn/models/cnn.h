#pragma once
// The reference small convolutional net (for 28x28 Fashion-MNIST):
//   conv1 3x3 (in -> 32, pad 1) + bn1 + ReLU + max-pool 2
//   conv2 3x3 (32 -> 64, pad 1) + bn2 + ReLU + max-pool 2
//   flatten, fc1 (64 * H/4 * W/4 -> 128) + ReLU (+ dropout), fc2 (128 -> classes).
// The PyTorch equivalent with the same state_dict keys is in the comment of cnn.cpp.
#include <memory>

#include "nn/models/registry.h"
#include "nn/modules/layers.h"

namespace trainer {

class Cnn : public Module {
 public:
  Cnn(int64_t in_channels, int64_t image_size, int64_t num_classes, double dropout,
      std::shared_ptr<Generator> dropout_gen, Generator& gen);
  Variable forward(const Variable& x) override;  // [N, C, H, W] -> [N, classes]

 private:
  int64_t image_size_;
  std::shared_ptr<Conv2d> conv1_, conv2_;
  std::shared_ptr<BatchNorm2d> bn1_, bn2_;
  std::shared_ptr<MaxPool2d> pool_;
  std::shared_ptr<Linear> fc1_, fc2_;
  std::shared_ptr<Dropout> dropout_;  // null when dropout == 0
};

std::shared_ptr<Module> make_cnn(const ModelOptions& options);

}  // namespace trainer
