#include "nn/modules/pooling.h"

#include <stdexcept>
#include <string>

#include "nn/functional.h"

namespace trainer {
namespace {

Pool2dParams make_params(const char* layer, int kernel_size, int stride, int padding, bool ceil_mode) {
  if (kernel_size <= 0 || stride < 0 || padding < 0)
    throw std::invalid_argument(std::string(layer) + "(kernel " + std::to_string(kernel_size) + ", stride " +
                                std::to_string(stride) + ", padding " + std::to_string(padding) +
                                "): kernel must be positive, stride and padding non-negative");
  if (2 * padding > kernel_size)
    throw std::invalid_argument(std::string(layer) + ": padding " + std::to_string(padding) +
                                " is more than half the kernel size " + std::to_string(kernel_size));
  Pool2dParams p;
  p.kernel_h = p.kernel_w = kernel_size;
  p.stride_h = p.stride_w = stride == 0 ? kernel_size : stride;
  p.pad_h = p.pad_w = padding;
  p.ceil_mode = ceil_mode;
  return p;
}

void check_4d(const char* layer, const Variable& x) {
  if (x.dim() != 4)
    throw std::invalid_argument(std::string(layer) + " expects input [N, C, H, W], got " +
                                shape_str(x.shape()));
}

}  // namespace

MaxPool2d::MaxPool2d(int kernel_size, int stride, int padding, bool ceil_mode)
    : params_(make_params("MaxPool2d", kernel_size, stride, padding, ceil_mode)) {}

Variable MaxPool2d::forward(const Variable& x) {
  check_4d("MaxPool2d", x);
  return F::max_pool2d(x, params_);
}

AvgPool2d::AvgPool2d(int kernel_size, int stride, int padding, bool ceil_mode, bool count_include_pad)
    : params_(make_params("AvgPool2d", kernel_size, stride, padding, ceil_mode)) {
  params_.count_include_pad = count_include_pad;
}

Variable AvgPool2d::forward(const Variable& x) {
  check_4d("AvgPool2d", x);
  return F::avg_pool2d(x, params_);
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(int output_h, int output_w) {
  if (output_h != 1 || output_w != 1)
    throw std::invalid_argument("AdaptiveAvgPool2d: only output size (1, 1) is supported, got (" +
                                std::to_string(output_h) + ", " + std::to_string(output_w) + ")");
}

Variable AdaptiveAvgPool2d::forward(const Variable& x) {
  check_4d("AdaptiveAvgPool2d", x);
  const int64_t n = x.size(0), c = x.size(1);
  return F::reshape(F::global_avg_pool(x), {n, c, 1, 1});
}

}  // namespace trainer
