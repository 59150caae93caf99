#include "nn/cuda/conv_geometry.h"

#include <cstdint>
#include <stdexcept>
#include <string>

namespace trainer::cudnn_conv {
namespace {

std::string params_str(const Conv2dParams& p) {
  return "stride (" + std::to_string(p.stride_h) + ", " + std::to_string(p.stride_w) + "), padding (" +
         std::to_string(p.pad_h) + ", " + std::to_string(p.pad_w) + "), dilation (" +
         std::to_string(p.dilation_h) + ", " + std::to_string(p.dilation_w) + "), groups " +
         std::to_string(p.groups);
}

}  // namespace

Shape check_geometry(const char* op, const Shape& x, const Shape& w, const Conv2dParams& p) {
  auto fail = [&](const std::string& why) {
    throw std::invalid_argument(std::string(op) + ": " + why + " (input " + shape_str(x) + ", weight " +
                                shape_str(w) + ", " + params_str(p) + ")");
  };
  if (x.size() != 4) fail("input must be 4-D [N, C, H, W]");
  if (w.size() != 4) fail("weight must be 4-D [O, C/groups, KH, KW]");
  if (p.stride_h < 1 || p.stride_w < 1) fail("stride must be at least 1");
  if (p.dilation_h < 1 || p.dilation_w < 1) fail("dilation must be at least 1");
  if (p.pad_h < 0 || p.pad_w < 0) fail("padding must be non-negative");
  if (p.groups < 1) fail("groups must be at least 1");
  if (x[1] < 1 || w[0] < 1 || w[2] < 1 || w[3] < 1) fail("channels and kernel sizes must be positive");
  if (x[1] % p.groups != 0) fail("input channels are not divisible by groups");
  if (w[0] % p.groups != 0) fail("output channels are not divisible by groups");
  if (w[1] * p.groups != x[1])
    fail("weight expects " + std::to_string(w[1] * p.groups) + " input channels, input has " +
         std::to_string(x[1]));
  if (x[2] + 2 * p.pad_h < p.dilation_h * (w[2] - 1) + 1 ||
      x[3] + 2 * p.pad_w < p.dilation_w * (w[3] - 1) + 1)
    fail("the (dilated) kernel is larger than the padded input");
  for (int64_t d : x)
    if (d > INT32_MAX) fail("dimension exceeds cuDNN's int range");
  return {x[0], w[0], conv_output_size(x[2], static_cast<int>(w[2]), p.stride_h, p.pad_h, p.dilation_h),
          conv_output_size(x[3], static_cast<int>(w[3]), p.stride_w, p.pad_w, p.dilation_w)};
}

}  // namespace trainer::cudnn_conv
