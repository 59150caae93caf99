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

 private:
  int64_t in_channels_, out_channels_;
  Conv2dParams params_;
  Variable weight_, bias_;
};

}  // namespace trainer
