#pragma once
// ResNet with torchvision's structure, module names and initialisation, so that state dicts load into
// torchvision.models.resnet{18,34,50} unchanged:
//   conv1, bn1, relu, maxpool, layer1..layer4 (BasicBlock or Bottleneck, the first block of a stage
//   has downsample.0 = conv1x1 and downsample.1 = BN when its shape changes), avgpool, fc.
// The cifar stem replaces the 7x7/2 conv + 3x3/2 max-pool by a 3x3/1 conv (still named conv1) and no
// max-pool, for 32x32 inputs.
#include <array>
#include <memory>

#include "nn/models/registry.h"
#include "nn/modules/layers.h"

namespace trainer {

class BasicBlock : public Module {
 public:
  static constexpr int64_t expansion = 1;
  BasicBlock(int64_t inplanes, int64_t planes, int stride, bool downsample, Generator& gen);
  Variable forward(const Variable& x) override;
  BatchNorm2d& last_bn() { return *bn2_; }

 private:
  std::shared_ptr<Conv2d> conv1_, conv2_;
  std::shared_ptr<BatchNorm2d> bn1_, bn2_;
  std::shared_ptr<Sequential> downsample_;  // null when the shortcut is the identity
};

// ResNet v1.5 bottleneck (torchvision): the stride sits on the 3x3 conv.
class Bottleneck : public Module {
 public:
  static constexpr int64_t expansion = 4;
  Bottleneck(int64_t inplanes, int64_t planes, int stride, bool downsample, Generator& gen);
  Variable forward(const Variable& x) override;
  BatchNorm2d& last_bn() { return *bn3_; }

 private:
  std::shared_ptr<Conv2d> conv1_, conv2_, conv3_;
  std::shared_ptr<BatchNorm2d> bn1_, bn2_, bn3_;
  std::shared_ptr<Sequential> downsample_;
};

enum class ResNetBlock { basic, bottleneck };
enum class ResNetStem { imagenet, cifar };
enum class ResNetDepth { resnet18, resnet34, resnet50 };

struct ResNetConfig {
  ResNetBlock block = ResNetBlock::basic;
  std::array<int, 4> layers = {2, 2, 2, 2};
  ResNetStem stem = ResNetStem::imagenet;
  int64_t in_channels = 3;
  int64_t num_classes = 1000;
  bool zero_init_residual = false;
  // Channels of the stem and the first stage; the stages double it (torchvision: 64). Narrower
  // networks keep the whole structure at a fraction of the size (the PyTorch golden test's model).
  int64_t width = 64;

  static ResNetConfig for_depth(ResNetDepth depth);
};

class ResNet : public Module {
 public:
  ResNet(const ResNetConfig& config, Generator& gen);
  Variable forward(const Variable& x) override;  // [N, C, H, W] -> [N, classes]

 private:
  std::shared_ptr<Sequential> make_layer(int64_t planes, int blocks, int stride, Generator& gen);

  ResNetConfig config_;
  int64_t inplanes_;
  std::shared_ptr<Conv2d> conv1_;
  std::shared_ptr<BatchNorm2d> bn1_;
  std::shared_ptr<MaxPool2d> maxpool_;  // null for the cifar stem
  std::array<std::shared_ptr<Sequential>, 4> stages_;
  std::shared_ptr<AdaptiveAvgPool2d> avgpool_;
  std::shared_ptr<Linear> fc_;
};

// ModelOptions.stem must be "imagenet" or "cifar"; dropout must be 0.
std::shared_ptr<Module> make_resnet(ResNetDepth depth, const ModelOptions& options);

}  // namespace trainer
