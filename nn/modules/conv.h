#pragma once
// 2-D convolution as torch.nn.Conv2d (square kernels): weight [out, in/groups, k, k], bias [out].
#include <cstdint>

#include "nn/backend.h"
#include "nn/init.h"
#include "nn/modules/module.h"

namespace trainer {

class Conv2d : public Module {
 public:
  // Initialised like PyTorch: weight kaiming_uniform(a=sqrt(5)), bias uniform(+-1/sqrt(fan_in)).
  Conv2d(int64_t in_channels, int64_t out_channels, int kernel_size, int stride = 1, int padding = 0,
         int dilation = 1, int groups = 1, bool bias = true, Generator& gen = init::default_generator());
  Variable forward(const Variable& x) override;  // [N, in, H, W] -> [N, out, H', W']
  void reset_parameters(Generator& gen);

  int64_t in_channels() const { return in_channels_; }
  int64_t out_channels() const { return out_channels_; }
  const Conv2dParams& params() const { return params_; }
  Variable& weight() { return weight_; }
  Variable& bias() { return bias_; }  // undefined without bias
  // Whether this convolution's output goes straight into a BatchNorm (every ResNet convolution's
  // does): in training, the backend may then compute the BatchNorm's batch statistics in the
  // convolution's epilogue (nn/fusion_hints.h). Numbers change only by the statistics' rounding. The
  // output must reach the BatchNorm unmodified: nothing checks for an in-place change in between.
  void set_feeds_batch_norm(bool feeds) { feeds_batch_norm_ = feeds; }
  bool feeds_batch_norm() const { return feeds_batch_norm_; }

 private:
  int64_t in_channels_, out_channels_;
  Conv2dParams params_;
  Variable weight_, bias_;
  bool feeds_batch_norm_ = false;
};

}  // namespace trainer
