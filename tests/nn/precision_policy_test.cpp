// Precision: the TOML names round-trip, and each precision's own decisions.
#include "nn/amp/precision_policy.h"

#include <gtest/gtest.h>

namespace trainer {
namespace {

TEST(Precision, NamesRoundTripAndNothingElseParses) {
  for (Precision p : {Precision::fp32, Precision::tf32, Precision::bf16, Precision::fp16})
    EXPECT_EQ(parse_precision(precision_name(p)), p);
  EXPECT_EQ(parse_precision("FP16"), std::nullopt);
  EXPECT_EQ(parse_precision("fp8"), std::nullopt);
  EXPECT_EQ(parse_precision(""), std::nullopt);
}

TEST(PrecisionPolicy, EachPrecisionDecidesAutocastTf32LossScalingAndLayout) {
  const PrecisionPolicy fp32 = precision_policy_for(Precision::fp32);
  EXPECT_FALSE(fp32.half());
  EXPECT_FALSE(fp32.allow_tf32);
  EXPECT_FALSE(fp32.loss_scaling);
  EXPECT_EQ(fp32.input_format, MemoryFormat::contiguous);

  const PrecisionPolicy tf32 = precision_policy_for(Precision::tf32);
  EXPECT_TRUE(tf32.allow_tf32);
  EXPECT_FALSE(tf32.half());

  const PrecisionPolicy bf16 = precision_policy_for(Precision::bf16);
  EXPECT_EQ(bf16.autocast, DType::bf16);
  EXPECT_FALSE(bf16.loss_scaling);
  EXPECT_EQ(bf16.input_format, MemoryFormat::channels_last);

  const PrecisionPolicy fp16 = precision_policy_for(Precision::fp16);
  EXPECT_EQ(fp16.autocast, DType::f16);
  EXPECT_TRUE(fp16.loss_scaling);
  EXPECT_FALSE(fp16.allow_tf32);
  EXPECT_EQ(fp16.input_format, MemoryFormat::channels_last);
  // What the device and the rest of the config add is the app's (app/run/device_setup.h).
  EXPECT_FALSE(fp16.loss_scale_on_device);
}

}  // namespace
}  // namespace trainer
