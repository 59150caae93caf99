#pragma once
// ConvNeXt with torchvision's structure, module names and initialisation, so that state dicts load
// into torchvision.models.convnext_tiny unchanged (and torchvision's into ours):
//   features.0    stem: 0 = Conv2d(in, widths[0], patch, stride patch), 1 = LayerNorm2d
//   features.2i+1 stage i: CNBlocks, each with block.{0 dw conv, 2 LayerNorm, 3 Linear, 5 Linear} and
//                 layer_scale
//   features.2i+2 downsampling between stages: 0 = LayerNorm2d, 1 = Conv2d(k 2, stride 2)
//   avgpool, classifier: 0 = LayerNorm2d, 1 = Flatten, 2 = Linear
// The network runs in channels-last memory: LayerNorm2d normalises the channels of a pixel where they
// are adjacent, and a block's per-pixel MLP is then two [N*H*W, C] GEMMs on a view (see CNBlock).
#include <cstdint>
#include <memory>
#include <vector>

#include "nn/models/registry.h"
#include "nn/modules/layers.h"

namespace trainer {

// torchvision's CNBlock: x + drop_path(layer_scale * MLP(LayerNorm(dwconv7x7(x)))), the MLP being
// Linear(C, 4C) -> GELU -> Linear(4C, C) over each pixel's channels.
class CNBlock : public Module {
 public:
  CNBlock(int64_t dim, double layer_scale, double drop_path, std::shared_ptr<Generator> drop_path_gen,
          Generator& gen);
  Variable forward(const Variable& x) override;  // [N, C, H, W] -> same, channels-last memory

  Variable& layer_scale() { return layer_scale_; }
  double drop_path() const { return stochastic_depth_->p(); }

 private:
  int64_t dim_;
  Variable layer_scale_;  // [C, 1, 1]
  std::shared_ptr<Conv2d> dwconv_;
  std::shared_ptr<Permute> to_nhwc_, to_nchw_;
  std::shared_ptr<LayerNorm> norm_;
  std::shared_ptr<Linear> fc1_, fc2_;
  std::shared_ptr<GELU> gelu_;
  std::shared_ptr<StochasticDepth> stochastic_depth_;
};

struct ConvNeXtConfig {
  std::vector<int64_t> depths = {3, 3, 9, 3};         // blocks per stage
  std::vector<int64_t> widths = {96, 192, 384, 768};  // channels per stage
  int64_t stem_patch = 4;                             // the stem's kernel = stride: non-overlapping patches
  int64_t in_channels = 3;
  int64_t num_classes = 1000;
  // The last block's drop-path probability; block b of B drops with stochastic_depth_prob * b / (B - 1).
  double stochastic_depth_prob = 0.1;
  double layer_scale = 1e-6;

  static ConvNeXtConfig tiny();  // torchvision's convnext_tiny
  // For 28x28 and 32x32 images: 2x2 stem patches (16, 8, 4, 2 pixels a side per stage at 32; patches
  // of 4 would leave the last stage 1x1 and its 7x7 convolutions mostly padding, patches of 1 would
  // make the stem a per-pixel linear map and cost 4x the compute of every stage) and timm's "femto"
  // sizes, depths 2, 2, 6, 2 and widths 48, 96, 192, 384 (about 5 million parameters).
  static ConvNeXtConfig small_images();
};

class ConvNeXt : public Module {
 public:
  ConvNeXt(const ConvNeXtConfig& config, std::shared_ptr<Generator> drop_path_gen, Generator& gen);
  Variable forward(const Variable& x) override;  // [N, C, H, W] -> [N, classes]

 private:
  std::shared_ptr<Sequential> features_;
  std::shared_ptr<AdaptiveAvgPool2d> avgpool_;
  std::shared_ptr<Sequential> classifier_;
};

// convnext_tiny: torchvision's sizes (ModelOptions.depths/widths, when given, must equal them);
// convnext: ConvNeXtConfig::small_images() with ModelOptions' depths, widths, stem_patch when given.
std::shared_ptr<Module> make_convnext_tiny(const ModelOptions& options);
std::shared_ptr<Module> make_convnext(const ModelOptions& options);

}  // namespace trainer
