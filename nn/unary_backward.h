#pragma once
// The derivative of each UnaryOp, shared by the CPU and CUDA backends (host and device code): one
// formula, so the backends cannot drift apart.
#include "nn/backend.h"

#if defined(__CUDACC__)
#define TRAINER_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TRAINER_HOST_DEVICE inline
#endif

namespace trainer {

// d op(x) / dx * g, using whichever of x and y = op(x) is cheaper.
template <class T>
TRAINER_HOST_DEVICE T unary_backward_value(UnaryOp op, T g, T x, T y) {
  switch (op) {
    case UnaryOp::neg:
      return -g;
    case UnaryOp::relu:
      return y > T(0) ? g : T(0);
    case UnaryOp::sigmoid:
      return g * y * (T(1) - y);
    case UnaryOp::exp:
      return g * y;
    case UnaryOp::log:
      return g / x;
    case UnaryOp::sqrt:
      return g / (T(2) * y);
    case UnaryOp::square:
      return g * T(2) * x;
    case UnaryOp::abs:
      return x > T(0) ? g : (x < T(0) ? -g : T(0));
  }
  return T(0);
}

}  // namespace trainer
