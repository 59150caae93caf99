#pragma once
// The CPU backend. Its methods are defined one op family per file in nn/cpu/.
#include "nn/backend.h"
#include "nn/backend_overrides.h"
#include "nn/dtype_dispatch.h"

namespace trainer {

class CpuBackend final : public Backend {
 public:
  TRAINER_BACKEND_OVERRIDES
};

// Runs `body` with `scalar_t` bound to float or double according to dtype; other dtypes throw.
#define TRAINER_DISPATCH_FLOAT(dtype, op_name, ...) \
  TRAINER_DISPATCH_F32_F64(dtype, op_name, "the CPU backend computes in f32 or f64", __VA_ARGS__)

}  // namespace trainer
