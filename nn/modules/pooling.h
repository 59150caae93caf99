#pragma once
// Pooling layers, as torch.nn.MaxPool2d / AvgPool2d / AdaptiveAvgPool2d (square windows).
#include "nn/backend.h"
#include "nn/modules/module.h"

namespace trainer {

class MaxPool2d : public Module {
 public:
  // stride 0 means stride = kernel_size, PyTorch's default.
  explicit MaxPool2d(int kernel_size, int stride = 0, int padding = 0, bool ceil_mode = false);
  Variable forward(const Variable& x) override;
  const Pool2dParams& params() const { return params_; }

 private:
  Pool2dParams params_;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(int kernel_size, int stride = 0, int padding = 0, bool ceil_mode = false,
                     bool count_include_pad = true);
  Variable forward(const Variable& x) override;
  const Pool2dParams& params() const { return params_; }

 private:
  Pool2dParams params_;
};

// Only output size (1, 1) (global average pooling) is supported: [N, C, H, W] -> [N, C, 1, 1].
class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(int output_size = 1) : AdaptiveAvgPool2d(output_size, output_size) {}
  AdaptiveAvgPool2d(int output_h, int output_w);
  Variable forward(const Variable& x) override;
};

}  // namespace trainer
