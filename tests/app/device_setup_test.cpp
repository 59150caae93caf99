// cudnn_fusion_state and cudnn_batchnorm_state: when train.cudnn_fusion and train.cudnn_batchnorm take
// effect, and the key the log names when they do not.
#include "app/run/device_setup.h"

#include <gtest/gtest.h>

#include <string>

namespace trainer {
namespace {

Config fusion_config(Precision precision) {
  Config c;
  c.train.cudnn_fusion = true;
  c.train.precision = precision;
  c.model.name = "resnet18";
  return c;
}

TEST(CudnnFusionState, OnOnlyForHalfPrecisionOnAGpuWithoutDeterminismOrSyncBn) {
  EXPECT_EQ(cudnn_fusion_state(Config{}, Device::cuda(0)), "off: train.cudnn_fusion = false");
  EXPECT_EQ(cudnn_fusion_state(fusion_config(Precision::bf16), Device::cuda(0)).rfind("on: ", 0), 0u);
  EXPECT_EQ(cudnn_fusion_state(fusion_config(Precision::fp16), Device::cuda(0)).rfind("on: ", 0), 0u);
  EXPECT_NE(cudnn_fusion_state(fusion_config(Precision::fp32), Device::cuda(0)).find("needs train.precision"),
            std::string::npos);
  EXPECT_NE(cudnn_fusion_state(fusion_config(Precision::bf16), Device::cpu()).find("on a GPU"),
            std::string::npos);
  Config deterministic = fusion_config(Precision::bf16);
  deterministic.train.deterministic = true;
  EXPECT_NE(cudnn_fusion_state(deterministic, Device::cuda(0)).find("off: train.deterministic"),
            std::string::npos);
  Config sync_bn = fusion_config(Precision::bf16);
  sync_bn.model.sync_bn = true;
  EXPECT_NE(cudnn_fusion_state(sync_bn, Device::cuda(0)).find("off: model.sync_bn"), std::string::npos);
  Config cnn = fusion_config(Precision::bf16);
  cnn.model.name = "cnn";
  EXPECT_NE(cudnn_fusion_state(cnn, Device::cuda(0)).find("not used: model.name = \"cnn\""),
            std::string::npos);
}

TEST(CudnnBatchnormState, OnOnlyForHalfPrecisionOnAGpuWithoutDeterminismOrSyncBn) {
  Config c;  // on by default
  c.train.precision = Precision::bf16;
  EXPECT_EQ(cudnn_batchnorm_state(c, Device::cuda(0)).rfind("on: ", 0), 0u);
  Config off = c;
  off.train.cudnn_batchnorm = false;
  EXPECT_EQ(cudnn_batchnorm_state(off, Device::cuda(0)), "off: train.cudnn_batchnorm = false");
  EXPECT_EQ(cudnn_batchnorm_state(c, Device::cpu()).rfind("not used: ", 0), 0u);
  EXPECT_NE(cudnn_batchnorm_state(c, Device::cpu()).find("on a GPU"), std::string::npos);
  EXPECT_EQ(cudnn_batchnorm_state(Config{}, Device::cuda(0)).rfind("not used: ", 0), 0u);  // fp32
  Config deterministic = c;
  deterministic.train.deterministic = true;
  EXPECT_NE(cudnn_batchnorm_state(deterministic, Device::cuda(0)).find("off: train.deterministic"),
            std::string::npos);
  Config sync_bn = c;
  sync_bn.model.sync_bn = true;
  EXPECT_NE(cudnn_batchnorm_state(sync_bn, Device::cuda(0)).find("not used: model.sync_bn"),
            std::string::npos);
}

// The run's one precision policy: fp16's scaler decides on the device unless clipping or ZeRO need the
// host (the reason step_graph_blocker gives too); the fused cuDNN paths follow their off reasons.
TEST(PrecisionPolicyForARun, LossScalerPlacementAndFusedPathsComeFromTheConfigAndDevice) {
  Config c;
  c.train.precision = Precision::fp16;
  c.model.name = "resnet18";
  c.train.cudnn_fusion = true;
  const PrecisionPolicy gpu = precision_policy(c, Device::cuda(0));
  EXPECT_TRUE(gpu.loss_scaling);
  EXPECT_TRUE(gpu.loss_scale_on_device);
  EXPECT_EQ(gpu.loss_scale_host_reason, "");
  EXPECT_TRUE(gpu.conv_stats_fusion);
  EXPECT_TRUE(gpu.cudnn_batch_norm);
  EXPECT_EQ(gpu.input_format, MemoryFormat::channels_last);

  Config clip = c;
  clip.optim.clip_grad_norm = 1;
  EXPECT_TRUE(precision_policy(clip, Device::cuda(0)).loss_scale_on_device);
  Config zero = c;
  zero.dist.zero_stage = 1;
  const PrecisionPolicy host = precision_policy(zero, Device::cuda(0));
  EXPECT_FALSE(host.loss_scale_on_device);
  EXPECT_EQ(host.loss_scale_host_reason, "dist.zero_stage");

  const PrecisionPolicy cpu = precision_policy(c, Device::cpu());
  EXPECT_FALSE(cpu.loss_scale_on_device);
  EXPECT_FALSE(cpu.conv_stats_fusion);
  EXPECT_FALSE(cpu.cudnn_batch_norm);

  Config tf32;
  tf32.train.precision = Precision::tf32;
  const PrecisionPolicy t = precision_policy(tf32, Device::cuda(0));
  EXPECT_TRUE(t.allow_tf32);
  EXPECT_FALSE(t.loss_scaling);
  EXPECT_FALSE(t.conv_stats_fusion);
}

}  // namespace
}  // namespace trainer
