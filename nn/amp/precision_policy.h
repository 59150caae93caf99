#pragma once
// train.precision as one enum, and what each value decides for a run: the forward's autocast dtype,
// TF32 tensor cores, dynamic loss scaling and the input layout. The decisions are made once, in one
// place (precision_policy_for, completed by the app for its device and config), and passed to the
// code that acts on them, so that no two places can decide differently.
#include <optional>
#include <string>
#include <string_view>

#include "nn/dtype.h"
#include "nn/tensor.h"

namespace trainer {

enum class Precision { fp32, tf32, bf16, fp16 };

// "fp32", "tf32", "bf16", "fp16": the TOML spelling.
std::string_view precision_name(Precision precision);
// The inverse of precision_name; none for any other text. The only place precision names are compared.
std::optional<Precision> parse_precision(std::string_view name);

struct PrecisionPolicy {
  Precision precision = Precision::fp32;
  std::optional<DType> autocast;  // bf16/fp16: the dtype convolutions and matmuls run in; none otherwise
  bool allow_tf32 = false;        // tf32: fp32 matmuls and convolutions on tensor cores
  bool loss_scaling = false;      // fp16: dynamic loss scaling with GradScaler semantics
  // Half precision takes channels-last (NHWC) input, where cuDNN's tensor-core kernels want it and
  // every later activation inherits it; NCHW otherwise.
  MemoryFormat input_format = MemoryFormat::contiguous;

  // What the run's device and other settings add (the app fills these in; false by default):
  bool loss_scale_on_device = false;   // the scaler decides on the device whether a step is skipped
  std::string loss_scale_host_reason;  // with loss scaling on a GPU: why it decides on the host ("" if not)
  bool conv_stats_fusion = false;      // BatchNorm statistics in the convolutions' epilogues, where faster
  bool cudnn_batch_norm = false;       // BatchNorm's backward through cuDNN's kernels

  bool half() const { return autocast.has_value(); }
};

// The decisions that follow from the precision alone.
PrecisionPolicy precision_policy_for(Precision precision);

}  // namespace trainer
