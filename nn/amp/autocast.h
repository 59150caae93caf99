#pragma once
// Autocast, as torch.autocast does it: inside an AutocastScope the ops that gain from tensor cores
// (conv2d, linear, matmul) run in the scope's half dtype whatever their inputs' dtype. Their inputs
// are cast with F::to_dtype, so fp32 parameters (the master weights) still receive fp32 gradients and
// the optimizer never sees a half value. Ops that need range or precision stay wide: cross_entropy
// upcasts half logits to fp32, and batch norm keeps its statistics in fp32 (accumulate_dtype).
// Everything else (relu, pooling, residual adds) runs in the dtype it is given, which after a
// convolution is the half dtype: activations are stored at half the size.
#include <initializer_list>
#include <optional>

#include "nn/dtype.h"

namespace trainer {

// The half dtype of the innermost scope on this thread; none outside every scope.
std::optional<DType> autocast_dtype();

// Whether an autocast op with inputs of these dtypes must cast them to autocast_dtype(): inside a
// scope, when one of them differs from it. f64 inputs opt out (asking for f64 means it).
bool autocast_applies(std::initializer_list<DType> input_dtypes);

class AutocastScope {
 public:
  // dtype: f16, bf16, or none (a scope that turns autocast off, e.g. for evaluation in fp32).
  explicit AutocastScope(std::optional<DType> dtype);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  std::optional<DType> previous_;
};

}  // namespace trainer
