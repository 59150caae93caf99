#pragma once
// The shape rules of a 2-D convolution on the GPU, checked before cuDNN sees the shapes: the CPU
// backend's rules, with errors that name the op, the shapes and the parameters.
#include "nn/backend.h"
#include "nn/tensor.h"

namespace trainer::cudnn_conv {

// Validates a convolution of input x [N, C, H, W] by weight w [O, C/groups, KH, KW] under p and
// returns the output shape; `op` names the caller in the error.
Shape check_geometry(const char* op, const Shape& x, const Shape& w, const Conv2dParams& p);

}  // namespace trainer::cudnn_conv
