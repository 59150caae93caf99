#include "nn/models/resnet.h"

#include <stdexcept>
#include <string>

#include "nn/functional.h"

namespace trainer {
namespace {

std::shared_ptr<Conv2d> conv3x3(int64_t in, int64_t out, int stride, Generator& gen) {
  return std::make_shared<Conv2d>(in, out, 3, stride, 1, 1, 1, false, gen);
}

std::shared_ptr<Conv2d> conv1x1(int64_t in, int64_t out, int stride, Generator& gen) {
  return std::make_shared<Conv2d>(in, out, 1, stride, 0, 1, 1, false, gen);
}

std::shared_ptr<Sequential> make_downsample(int64_t in, int64_t out, int stride, Generator& gen) {
  auto seq = std::make_shared<Sequential>();
  seq->push_back(conv1x1(in, out, stride, gen));
  seq->push_back(std::make_shared<BatchNorm2d>(out));
  return seq;
}

}  // namespace

BasicBlock::BasicBlock(int64_t inplanes, int64_t planes, int stride, bool downsample, Generator& gen) {
  conv1_ = register_module("conv1", conv3x3(inplanes, planes, stride, gen));
  bn1_ = register_module("bn1", std::make_shared<BatchNorm2d>(planes));
  // torchvision registers relu here; it has no state, so it is applied functionally.
  conv2_ = register_module("conv2", conv3x3(planes, planes, 1, gen));
  bn2_ = register_module("bn2", std::make_shared<BatchNorm2d>(planes));
  if (downsample) downsample_ = register_module("downsample", make_downsample(inplanes, planes, stride, gen));
}

Variable BasicBlock::forward(const Variable& x) {
  // bn + relu and bn + residual add + relu each run as one pass (BatchNorm2d's fused tail).
  const Variable out = bn1_->forward(conv1_->forward(x), Variable(), true);
  const Variable identity = downsample_ ? downsample_->forward(x) : x;
  return bn2_->forward(conv2_->forward(out), identity, true);
}

Bottleneck::Bottleneck(int64_t inplanes, int64_t planes, int stride, bool downsample, Generator& gen) {
  const int64_t width = planes;  // base_width 64, groups 1
  conv1_ = register_module("conv1", conv1x1(inplanes, width, 1, gen));
  bn1_ = register_module("bn1", std::make_shared<BatchNorm2d>(width));
  conv2_ = register_module("conv2", conv3x3(width, width, stride, gen));
  bn2_ = register_module("bn2", std::make_shared<BatchNorm2d>(width));
  conv3_ = register_module("conv3", conv1x1(width, planes * expansion, 1, gen));
  bn3_ = register_module("bn3", std::make_shared<BatchNorm2d>(planes * expansion));
  if (downsample)
    downsample_ = register_module("downsample", make_downsample(inplanes, planes * expansion, stride, gen));
}

Variable Bottleneck::forward(const Variable& x) {
  Variable out = bn1_->forward(conv1_->forward(x), Variable(), true);
  out = bn2_->forward(conv2_->forward(out), Variable(), true);
  const Variable identity = downsample_ ? downsample_->forward(x) : x;
  return bn3_->forward(conv3_->forward(out), identity, true);
}

ResNetConfig ResNetConfig::for_depth(ResNetDepth depth) {
  ResNetConfig c;
  switch (depth) {
    case ResNetDepth::resnet18:
      c.block = ResNetBlock::basic;
      c.layers = {2, 2, 2, 2};
      break;
    case ResNetDepth::resnet34:
      c.block = ResNetBlock::basic;
      c.layers = {3, 4, 6, 3};
      break;
    case ResNetDepth::resnet50:
      c.block = ResNetBlock::bottleneck;
      c.layers = {3, 4, 6, 3};
      break;
  }
  return c;
}

ResNet::ResNet(const ResNetConfig& config, Generator& gen) : config_(config), inplanes_(config.width) {
  if (config.width < 1) throw std::invalid_argument("ResNet: width must be at least 1");
  const int64_t w = config.width;
  if (config.stem == ResNetStem::imagenet) {
    conv1_ =
        register_module("conv1", std::make_shared<Conv2d>(config.in_channels, w, 7, 2, 3, 1, 1, false, gen));
  } else {
    conv1_ = register_module("conv1", conv3x3(config.in_channels, w, 1, gen));
  }
  bn1_ = register_module("bn1", std::make_shared<BatchNorm2d>(w));
  if (config.stem == ResNetStem::imagenet)
    maxpool_ = register_module("maxpool", std::make_shared<MaxPool2d>(3, 2, 1));
  const int64_t planes[4] = {w, 2 * w, 4 * w, 8 * w};
  for (int i = 0; i < 4; ++i)
    stages_[i] = register_module("layer" + std::to_string(i + 1),
                                 make_layer(planes[i], config.layers[i], i == 0 ? 1 : 2, gen));
  avgpool_ = register_module("avgpool", std::make_shared<AdaptiveAvgPool2d>(1));
  const int64_t expansion =
      config.block == ResNetBlock::basic ? BasicBlock::expansion : Bottleneck::expansion;
  fc_ = register_module("fc", std::make_shared<Linear>(8 * w * expansion, config.num_classes, true, gen));

  // torchvision's re-initialisation; fc keeps Linear's default.
  for (auto& [name, m] : named_modules()) {
    if (auto* conv = dynamic_cast<Conv2d*>(m)) {
      init::kaiming_normal_(conv->weight().data(), gen, 0.0, init::FanMode::fan_out,
                            init::Nonlinearity::relu);
      conv->set_feeds_batch_norm(
          true);  // every ResNet convolution (stem, blocks, shortcuts) is followed by one
    } else if (auto* bn = dynamic_cast<BatchNorm2d*>(m)) {
      bn->reset_parameters();  // weight 1, bias 0
    }
  }
  if (config.zero_init_residual) {
    for (auto& [name, m] : named_modules()) {
      if (auto* block = dynamic_cast<BasicBlock*>(m)) block->last_bn().weight().data().fill_(0.0);
      if (auto* block = dynamic_cast<Bottleneck*>(m)) block->last_bn().weight().data().fill_(0.0);
    }
  }
}

std::shared_ptr<Sequential> ResNet::make_layer(int64_t planes, int blocks, int stride, Generator& gen) {
  auto layer = std::make_shared<Sequential>();
  const bool basic = config_.block == ResNetBlock::basic;
  const int64_t expansion = basic ? BasicBlock::expansion : Bottleneck::expansion;
  for (int b = 0; b < blocks; ++b) {
    const int s = b == 0 ? stride : 1;
    const bool downsample = b == 0 && (stride != 1 || inplanes_ != planes * expansion);
    if (basic)
      layer->push_back(std::make_shared<BasicBlock>(inplanes_, planes, s, downsample, gen));
    else
      layer->push_back(std::make_shared<Bottleneck>(inplanes_, planes, s, downsample, gen));
    inplanes_ = planes * expansion;
  }
  return layer;
}

Variable ResNet::forward(const Variable& x) {
  Variable h = bn1_->forward(conv1_->forward(x), Variable(), true);  // [N, 64, H/2, W/2] (imagenet stem)
  if (maxpool_) h = maxpool_->forward(h);                            // [N, 64, H/4, W/4]
  for (auto& stage : stages_) h = stage->forward(h);                 // [N, 512 * expansion, H/32, W/32]
  h = F::flatten(avgpool_->forward(h), 1);                           // [N, 512 * expansion]
  return fc_->forward(h);
}

std::shared_ptr<Module> make_resnet(ResNetDepth depth, const ModelOptions& o) {
  ResNetConfig config = ResNetConfig::for_depth(depth);
  if (o.stem == "imagenet")
    config.stem = ResNetStem::imagenet;
  else if (o.stem == "cifar")
    config.stem = ResNetStem::cifar;
  else
    throw std::invalid_argument("model '" + o.name + "': unknown stem '" + o.stem +
                                "'; known stems: cifar, imagenet");
  if (o.dropout > 0.0)
    throw std::invalid_argument("model '" + o.name +
                                "' has no dropout; 'cnn' and the ViTs support dropout > 0");
  config.in_channels = o.in_channels;
  config.num_classes = o.num_classes;
  config.zero_init_residual = o.zero_init_residual;
  config.width = o.width;
  Generator gen(o.seed);
  return std::make_shared<ResNet>(config, gen);
}

}  // namespace trainer
