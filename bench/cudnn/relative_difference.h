#pragma once
// How far a probe's result is from ours, as one number the probes print.
#include "nn/tensor.h"

namespace trainer::bench {

// max |a - b| / max |b| of two tensors of one shape, on the host in f32.
double relative_difference(const Tensor& a, const Tensor& b);

}  // namespace trainer::bench
