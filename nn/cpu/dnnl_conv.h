#pragma once
// 2-D convolutions through oneDNN (forward, data gradient, weight gradient) for the CPU backend.
//
// PyTorch's CPU convolutions run on the same library (Debian's libdnnl), and its JIT kernels on its
// blocked layouts are much faster than our im2col + OpenBLAS path on resnet18-cifar (figures:
// bench/PERF_NOTES.md, "CPU: oneDNN convolutions (session 11)"). Only f32 is taken: oneDNN
// has no f64 convolution, so f64 (the gradient checks, the PyTorch float64 goldens) stays on im2col.
//
// Each function returns an undefined tensor when oneDNN does not take the convolution (f64, a shape
// it rejects, or a build without oneDNN); the caller then runs im2col. Inputs are NCHW or
// channels-last; the result follows the layout of x (forward, weight gradient) or grad_y (data
// gradient), as the CUDA backend's does. Shapes are validated by the caller.
#include "nn/backend.h"

namespace trainer {

#ifdef TRAINER_WITH_DNNL
Tensor dnnl_conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p);
Tensor dnnl_conv2d_backward_input(const Tensor& grad_y, const Tensor& w, const Shape& x_shape,
                                  const Conv2dParams& p);
Tensor dnnl_conv2d_backward_weight(const Tensor& grad_y, const Tensor& x, const Shape& w_shape,
                                   const Conv2dParams& p);
#else
inline Tensor dnnl_conv2d(const Tensor&, const Tensor&, const Tensor&, const Conv2dParams&) { return {}; }
inline Tensor dnnl_conv2d_backward_input(const Tensor&, const Tensor&, const Shape&, const Conv2dParams&) {
  return {};
}
inline Tensor dnnl_conv2d_backward_weight(const Tensor&, const Tensor&, const Shape&, const Conv2dParams&) {
  return {};
}
#endif

}  // namespace trainer
