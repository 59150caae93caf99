#pragma once
// The value of each elementwise op and the derivative of each UnaryOp, shared by the CPU and CUDA
// backends (host and device code): one formula per op, so the backends cannot drift apart.
#include <cmath>

#include "nn/backend.h"

#if defined(__CUDACC__)
#define TRAINER_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TRAINER_HOST_DEVICE inline
#endif

namespace trainer {

// GELU's constants (PyTorch's): 1/sqrt(2), 1/sqrt(2 pi), and the tanh form's sqrt(2/pi) and cubic term.
inline constexpr double kInvSqrt2 = 0.70710678118654752440;
inline constexpr double kInvSqrt2Pi = 0.39894228040143267794;
inline constexpr double kSqrt2OverPi = 0.79788456080286535588;
inline constexpr double kGeluTanhCubic = 0.044715;

template <class T>
TRAINER_HOST_DEVICE T binary_value(BinaryOp op, T a, T b) {
  switch (op) {
    case BinaryOp::add:
      return a + b;
    case BinaryOp::sub:
      return a - b;
    case BinaryOp::mul:
      return a * b;
    case BinaryOp::div:
      return a / b;
  }
  return T(0);
}

// Unqualified calls: std's float/double overloads on the host, CUDA's on the device.
template <class T>
TRAINER_HOST_DEVICE T unary_value(UnaryOp op, T x) {
  using std::erf;
  using std::exp;
  using std::fabs;
  using std::log;
  using std::sqrt;
  using std::tanh;
  switch (op) {
    case UnaryOp::neg:
      return -x;
    case UnaryOp::relu:
      return x > T(0) ? x : T(0);
    case UnaryOp::sigmoid:
      return T(1) / (T(1) + exp(-x));
    case UnaryOp::exp:
      return exp(x);
    case UnaryOp::log:
      return log(x);
    case UnaryOp::sqrt:
      return sqrt(x);
    case UnaryOp::square:
      return x * x;
    case UnaryOp::abs:
      return fabs(x);
    case UnaryOp::gelu_erf:  // x * Phi(x)
      return T(0.5) * x * (T(1) + erf(x * T(kInvSqrt2)));
    case UnaryOp::gelu_tanh:
      return T(0.5) * x * (T(1) + tanh(T(kSqrt2OverPi) * (x + T(kGeluTanhCubic) * x * x * x)));
  }
  return T(0);
}

// d op(x) / dx * g, using whichever of x and y = op(x) is cheaper.
template <class T>
TRAINER_HOST_DEVICE T unary_backward_value(UnaryOp op, T g, T x, T y) {
  using std::erf;
  using std::exp;
  using std::tanh;
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
    case UnaryOp::gelu_erf:  // Phi(x) + x * phi(x)
      return g * (T(0.5) * (T(1) + erf(x * T(kInvSqrt2))) + x * T(kInvSqrt2Pi) * exp(T(-0.5) * x * x));
    case UnaryOp::gelu_tanh: {  // from x: y alone does not give tanh's argument
      const T x2 = x * x;
      const T t = tanh(T(kSqrt2OverPi) * (x + T(kGeluTanhCubic) * x2 * x));
      const T dinner = T(kSqrt2OverPi) * (T(1) + T(3 * kGeluTanhCubic) * x2);
      return g * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * dinner);
    }
  }
  return T(0);
}

}  // namespace trainer
