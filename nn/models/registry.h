#pragma once
// Models by name. A new model is one file pair that defines a factory plus one line in registry.cpp.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/modules/module.h"
#include "nn/random.h"

namespace trainer {

struct ModelOptions {
  std::string name =
      "resnet18";  // mlp | cnn | resnet18/34/50 | vit_b_16 | vit_s_16 | vit | convnext_tiny | convnext
  std::string stem = "imagenet";  // ResNet only: imagenet (7x7/2 conv + max-pool) | cifar (3x3/1 conv)
  int64_t in_channels = 3;
  int64_t num_classes = 10;
  int64_t image_size = 32;          // height = width; sizes the linear layers of mlp and cnn
  double dropout = 0.0;             // cnn: before the last linear layer; ViTs: torchvision's dropout
  uint64_t seed = 0;                // initial weights depend only on this
  int64_t width = 64;               // ResNet: channels of the stem and first stage; vit: token width D
  bool zero_init_residual = false;  // ResNet: last BN of each block starts at 0 (torchvision's option)
  // The small ViT ("vit"; vit_b_16 and vit_s_16 fix these). The defaults suit 28x28 Fashion-MNIST and
  // 32x32 CIFAR alike: 7x7 or 8x8 patches of 4 pixels, 6 layers of 4 heads at width 64.
  int64_t patch_size = 4;  // square patches; must divide image_size
  int64_t depth = 6;       // encoder layers
  int64_t heads = 4;       // attention heads; must divide width
  int64_t mlp_dim = 256;   // hidden width of each layer's MLP
  // ConvNeXt: blocks per stage and channels per stage (empty: the model's own; convnext_tiny accepts
  // only its own), and the stem's patch size = kernel = stride (0: 4 for convnext_tiny, 2 for convnext).
  std::vector<int64_t> depths, widths;
  int64_t stem_patch = 0;
  // Stochastic depth: the largest drop-path probability, reached by the last block (unset: ConvNeXt's 0.1).
  std::optional<double> drop_path;
  double layer_scale = 1e-6;  // ConvNeXt: initial value of each block's layer_scale
  // Draws the dropout masks; when null the model makes its own, seeded from `seed`.
  std::shared_ptr<Generator> dropout_generator;
};

using ModelFactory = std::function<std::shared_ptr<Module>(const ModelOptions&)>;

// Builds the named model; throws std::invalid_argument for an unknown name or bad options.
std::shared_ptr<Module> create_model(const ModelOptions& options);
std::vector<std::string> model_names();
// Whether the model takes ModelOptions::stem (the ResNets: a CIFAR or an ImageNet stem).
bool model_has_stem_choice(const std::string& name);
// The state-dict prefix of the model's classifier head, whose shape follows the class count ("fc." of a
// ResNet, "heads.head." of a ViT, "classifier.2." of a ConvNeXt, the last linear of mlp and cnn).
std::string classifier_prefix(const std::string& name);
// The generator of the model's dropout and drop-path masks: options.dropout_generator, or one seeded
// from options.seed when that is null.
std::shared_ptr<Generator> dropout_generator_for(const ModelOptions& options);

}  // namespace trainer
