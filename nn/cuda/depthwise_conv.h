#pragma once
// Depthwise convolutions (groups = in channels = out channels: ConvNeXt's 7x7 blocks) in channels-last
// memory through our own kernels instead of cuDNN. cuDNN runs them as grouped convolutions: on an H100,
// ConvNeXt-T's depthwise 7x7s took 170 of a 247 ms bf16 step at batch 128, the weight gradient alone
// 120 ms (issue 38), where each direction needs one pass over its tensors.
//
// Taken for stride 1, dilation 1, square 3x3, 5x5 or 7x7 kernels with "same" padding (kernel / 2),
// f32, f16 and bf16 (sums in f32), when the input (forward, weight gradient) or grad_y (input
// gradient) is channels-last; NCHW and every other case stay with cuDNN. The kernels are
// deterministic (the weight gradient sums per-block partials in a fixed order, and the partition
// depends on the shapes alone), so they also run under train.deterministic and inside CUDA graphs.
#include <cstdint>

#include "nn/backend.h"
#include "nn/tensor.h"

namespace trainer::cuda {

// Whether the depthwise kernels run the convolution of an [N, C, H, W] input by weight w_shape under
// p, given the tensor that sets the layout (x, or grad_y for the input gradient) and its dtype.
bool depthwise_conv_applies(const Tensor& layout_source, const Shape& x_shape, const Shape& w_shape,
                            const Conv2dParams& p);

// y = conv(x, w) + bias (bias may be undefined): [N, C, H, W] in channels-last memory.
Tensor depthwise_conv_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p);

// dx: the forward's structure with the kernel rotated by 180 degrees; channels-last.
Tensor depthwise_conv_backward_input(const Tensor& grad_y, const Tensor& w, const Shape& x_shape,
                                     const Conv2dParams& p);

// dw [C, 1, K, K] in `format`, and where grad_bias is non-null, the bias gradient (the sum of grad_y
// over N, H, W, [C]) from the same pass.
Tensor depthwise_conv_backward_weight(const Tensor& grad_y, const Tensor& x, const Shape& w_shape,
                                      const Conv2dParams& p, MemoryFormat format,
                                      Tensor* grad_bias = nullptr);

// Calls the depthwise kernels have run (each direction counts one), for tests.
int64_t depthwise_conv_calls();

}  // namespace trainer::cuda
