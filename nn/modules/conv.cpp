#include "nn/modules/conv.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "nn/functional.h"
#include "nn/fusion_hints.h"

namespace trainer {

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int kernel_size, int stride, int padding,
               int dilation, int groups, bool bias, Generator& gen)
    : in_channels_(in_channels), out_channels_(out_channels) {
  const std::string what = "Conv2d(" + std::to_string(in_channels) + ", " + std::to_string(out_channels) +
                           ", kernel " + std::to_string(kernel_size) + ")";
  if (in_channels <= 0 || out_channels <= 0 || kernel_size <= 0 || stride <= 0 || padding < 0 ||
      dilation <= 0 || groups <= 0)
    throw std::invalid_argument(what + ": sizes must be positive (padding non-negative)");
  if (in_channels % groups != 0 || out_channels % groups != 0)
    throw std::invalid_argument(what + ": channels must be divisible by groups=" + std::to_string(groups));
  params_.stride_h = params_.stride_w = stride;
  params_.pad_h = params_.pad_w = padding;
  params_.dilation_h = params_.dilation_w = dilation;
  params_.groups = groups;
  weight_ = register_parameter("weight",
                               Tensor::empty({out_channels, in_channels / groups, kernel_size, kernel_size}));
  if (bias) bias_ = register_parameter("bias", Tensor::empty({out_channels}));
  reset_parameters(gen);
}

void Conv2d::reset_parameters(Generator& gen) {
  init::kaiming_uniform_(weight_.data(), gen, std::sqrt(5.0));
  if (bias_.defined()) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(init::fan_in_and_fan_out(weight_.data()).first));
    init::uniform_(bias_.data(), -bound, bound, gen);
  }
}

Variable Conv2d::forward(const Variable& x) {
  if (x.dim() != 4 || x.size(1) != in_channels_)
    throw std::invalid_argument("Conv2d(" + std::to_string(in_channels_) + ", " +
                                std::to_string(out_channels_) + ") expects input [N, " +
                                std::to_string(in_channels_) + ", H, W], got " + shape_str(x.shape()));
  const ConvFeedsBatchNormStats hint(feeds_batch_norm_ && is_training());
  return F::conv2d(x, weight_, bias_, params_);
}

}  // namespace trainer
