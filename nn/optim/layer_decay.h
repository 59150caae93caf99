#pragma once
// Layer-wise learning-rate decay for fine-tuning, as timm's param_groups_layer_decay: every parameter
// gets a layer id from 0 (the input end) to L (the head), and its group's learning rate is scaled by
// layer_decay^(L - id), so the head trains at the full rate and each layer below at layer_decay times
// the one above. The ids by model, from torchvision's parameter names:
//   ViT:      class_token, conv_proj.*, encoder.pos_embedding -> 0; encoder.layers.encoder_layer_<i>.*
//             -> i + 1; everything else (encoder.ln, heads.*) -> L = layers + 1 (timm's ids);
//   ResNet:   conv1, bn1 -> 0; layer<k>.* -> k; fc.* (and anything else) -> L = 5;
//   ConvNeXt: features.<k>.* -> k (the stem 0, stages and their downsampling layers 1..7, one id each
//             as torchvision numbers them); classifier.* (and anything else) -> L = last feature + 1;
//   others:   the index of the top-level module (the first component of the name) in parameter order,
//             the last one being L.
#include <string>
#include <vector>

#include "nn/optim/optimizer.h"

namespace trainer {

// The layer id of each name (in order), by the rules above.
std::vector<int> layer_ids(const std::vector<std::string>& names);

// Splits every group into one group per layer ("<group>_layer_<id>", keeping its weight decay), with
// lr_scale = layer_decay^(L - id); groups in order of layer, then of the input groups.
std::vector<ParamGroup> split_by_layer(std::vector<ParamGroup> groups, double layer_decay);

}  // namespace trainer
