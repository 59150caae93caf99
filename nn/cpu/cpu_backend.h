#pragma once
// The CPU backend. Its methods are defined one op family per file in nn/cpu/.
#include <stdexcept>
#include <string>

#include "nn/backend.h"
#include "nn/backend_overrides.h"

namespace trainer {

class CpuBackend final : public Backend {
 public:
  TRAINER_BACKEND_OVERRIDES
};

// Runs `body` with `scalar_t` bound to float or double according to dtype; other dtypes throw.
#define TRAINER_DISPATCH_FLOAT(dtype, op_name, ...)                                              \
  [&] {                                                                                          \
    switch (dtype) {                                                                             \
      case ::trainer::DType::f32: {                                                              \
        using scalar_t = float;                                                                  \
        return __VA_ARGS__();                                                                    \
      }                                                                                          \
      case ::trainer::DType::f64: {                                                              \
        using scalar_t = double;                                                                 \
        return __VA_ARGS__();                                                                    \
      }                                                                                          \
      default:                                                                                   \
        throw std::invalid_argument(std::string(op_name) + ": the CPU backend computes in f32 or " \
                                    "f64, got " + std::string(::trainer::dtype_name(dtype)));     \
    }                                                                                            \
  }()

}  // namespace trainer
