#pragma once
// Convolutions with few input channels (a ResNet's RGB stem) as im2col + one cuBLAS GEMM, where that
// times faster than cuDNN. cuDNN pads a 3-channel NHWC input to 8 channels and runs ResNet-50's 7x7
// stem forward on an sm80 kernel, most of whose work is then padding, plus its padding kernels: the
// stem takes long for the little arithmetic it needs. Laid out as a [N*OH*OW, kp] matrix of patches
// (kp = kh*kw*C rounded up to 8: 152 for 7x7x3), the forward is one GEMM against the [Cout, kp] weight
// that writes the NHWC output directly; the weight gradient is one GEMM of the output gradient against
// the same patches, rebuilt in the backward (not kept: 976 MB at batch 256). Measured: ResNet-50's
// stem forward takes it (a small gain a step), its weight gradient stays on cuDNN, which times faster
// there (figures: bench/PERF_NOTES.md, v14). That was with a patch kernel that divided to find each
// pack's place, bound by that index arithmetic; the kernel now steps through a table instead
// (im2col_patches.h), not yet timed on a GPU.
//
// Taken for bf16/f16 channels-last inputs with at most 4 channels and kh*kw*C <= 256, groups 1,
// outside train.deterministic, when the patch matrix fits in 4 GiB. Each shape and direction is timed against
// cuDNN at its first eager call and the faster kept; a shape first met inside a CUDA graph capture
// runs cuDNN, and so does a call whose im2col path throws (out of memory, say). The GEMMs keep their
// reductions in f32, as the cuDNN engines the trainer allows do.
#include <functional>
#include <optional>

#include "nn/backend.h"
#include "nn/tensor.h"

namespace trainer::cuda {

// The forward through im2col + GEMM where it applies and timed faster than `cudnn` (which runs the
// same convolution through cuDNN); nullopt where cuDNN should run it.
std::optional<Tensor> im2col_conv_forward(const Tensor& x, const Tensor& w, const Conv2dParams& p,
                                          const Shape& y_shape, const std::function<Tensor()>& cudnn);

// The weight gradient likewise, in memory format `format`.
std::optional<Tensor> im2col_conv_backward_weight(const Tensor& grad_y, const Tensor& x, const Shape& w_shape,
                                                  const Conv2dParams& p, MemoryFormat format,
                                                  const std::function<Tensor()>& cudnn);

// Tests run the im2col path wherever it applies, without timing: BackendOptions::force_im2col_conv.
// Calls the im2col path has run (forward and weight gradient).
int64_t im2col_conv_calls();

}  // namespace trainer::cuda
