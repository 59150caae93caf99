#include "nn/amp/autocast.h"

#include <stdexcept>
#include <string>

namespace trainer {
namespace {
thread_local std::optional<DType> current;
}  // namespace

std::optional<DType> autocast_dtype() { return current; }

bool autocast_applies(std::initializer_list<DType> input_dtypes) {
  if (!current) return false;
  bool differs = false;
  for (DType d : input_dtypes) {
    if (d == DType::f64) return false;
    differs = differs || d != *current;
  }
  return differs;
}

AutocastScope::AutocastScope(std::optional<DType> dtype) : previous_(current) {
  if (dtype && !is_half(*dtype))
    throw std::invalid_argument("autocast: the dtype must be f16 or bf16, got " +
                                std::string(dtype_name(*dtype)));
  current = dtype;
}

AutocastScope::~AutocastScope() { current = previous_; }

}  // namespace trainer
