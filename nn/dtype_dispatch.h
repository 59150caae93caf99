#pragma once
// The one definition of dtype dispatch for both backends: a switch on a tensor's dtype that binds
// `scalar_t` to its element type and runs the body, or throws naming the op, what it computes in and
// the dtype it got. nn/cpu/cpu_backend.h (TRAINER_DISPATCH_FLOAT) and nn/cuda/kernels.cuh
// (CUDA_DISPATCH_FLOAT, with the half types; CUDA_DISPATCH_F32_F64) build on it. Plain C++, so nvcc
// reads it too.
#include <stdexcept>
#include <string>

#include "nn/dtype.h"

// One case: `scalar_t` = `type` for DType::`value`, then the body (a lambda) is called.
#define TRAINER_DTYPE_CASE(value, type, ...) \
  case ::trainer::DType::value: {            \
    using scalar_t = type;                   \
    return __VA_ARGS__();                    \
  }

// The other dtypes: "op_name: <computes_in>, got bf16".
#define TRAINER_DTYPE_UNSUPPORTED(dtype, op_name, computes_in)                         \
  default:                                                                             \
    throw std::invalid_argument(std::string(op_name) + ": " + computes_in + ", got " + \
                                std::string(::trainer::dtype_name(dtype)));

// f32 and f64 only (the CPU backend; the optimizer kernels on the GPU).
#define TRAINER_DISPATCH_F32_F64(dtype, op_name, computes_in, ...) \
  [&] {                                                            \
    switch (dtype) {                                               \
      TRAINER_DTYPE_CASE(f32, float, __VA_ARGS__)                  \
      TRAINER_DTYPE_CASE(f64, double, __VA_ARGS__)                 \
      TRAINER_DTYPE_UNSUPPORTED(dtype, op_name, computes_in)       \
    }                                                              \
  }()
