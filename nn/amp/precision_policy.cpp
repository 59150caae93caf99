#include "nn/amp/precision_policy.h"

#include <array>
#include <utility>

namespace trainer {
namespace {

constexpr std::array<std::pair<Precision, std::string_view>, 4> kNames{{
    {Precision::fp32, "fp32"},
    {Precision::tf32, "tf32"},
    {Precision::bf16, "bf16"},
    {Precision::fp16, "fp16"},
}};

}  // namespace

std::string_view precision_name(Precision precision) {
  for (const auto& [value, name] : kNames)
    if (value == precision) return name;
  return "fp32";
}

std::optional<Precision> parse_precision(std::string_view name) {
  for (const auto& [value, spelling] : kNames)
    if (spelling == name) return value;
  return std::nullopt;
}

PrecisionPolicy precision_policy_for(Precision precision) {
  PrecisionPolicy policy;
  policy.precision = precision;
  if (precision == Precision::bf16) policy.autocast = DType::bf16;
  if (precision == Precision::fp16) policy.autocast = DType::f16;
  policy.allow_tf32 = precision == Precision::tf32;
  policy.loss_scaling = precision == Precision::fp16;
  policy.input_format = policy.half() ? MemoryFormat::channels_last : MemoryFormat::contiguous;
  return policy;
}

}  // namespace trainer
