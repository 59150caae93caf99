// Layer-wise LR decay: the layer ids of ViT, ResNet and ConvNeXt parameter names (torchvision's), the
// groups' lr_scale = decay^(last - id), and every optimizer stepping each group at its own LR.
#include "nn/optim/layer_decay.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "nn/models/registry.h"
#include "nn/optim/adamw.h"
#include "nn/optim/lamb.h"
#include "nn/optim/lars.h"
#include "nn/optim/sgd.h"

namespace trainer {
namespace {

std::map<std::string, int> ids_of(const std::vector<std::string>& names) {
  const std::vector<int> ids = layer_ids(names);
  std::map<std::string, int> out;
  for (size_t i = 0; i < names.size(); ++i) out[names[i]] = ids[i];
  return out;
}

TEST(LayerDecay, VitIdsFollowTimm) {
  const auto ids =
      ids_of({"class_token", "conv_proj.weight", "conv_proj.bias", "encoder.pos_embedding",
              "encoder.layers.encoder_layer_0.ln_1.weight", "encoder.layers.encoder_layer_1.mlp.0.weight",
              "encoder.layers.encoder_layer_11.ln_2.bias", "encoder.ln.weight", "heads.head.weight"});
  EXPECT_EQ(ids.at("class_token"), 0);
  EXPECT_EQ(ids.at("conv_proj.weight"), 0);
  EXPECT_EQ(ids.at("encoder.pos_embedding"), 0);
  EXPECT_EQ(ids.at("encoder.layers.encoder_layer_0.ln_1.weight"), 1);
  EXPECT_EQ(ids.at("encoder.layers.encoder_layer_1.mlp.0.weight"), 2);
  EXPECT_EQ(ids.at("encoder.layers.encoder_layer_11.ln_2.bias"), 12);
  EXPECT_EQ(ids.at("encoder.ln.weight"), 13);
  EXPECT_EQ(ids.at("heads.head.weight"), 13);
}

TEST(LayerDecay, ResnetAndConvnextIds) {
  ModelOptions o;
  o.name = "resnet18";
  o.num_classes = 10;
  std::vector<std::string> names;
  for (const auto& p : create_model(o)->named_parameters()) names.push_back(p.name);
  const auto r = ids_of(names);
  EXPECT_EQ(r.at("conv1.weight"), 0);
  EXPECT_EQ(r.at("bn1.weight"), 0);
  EXPECT_EQ(r.at("layer1.0.conv1.weight"), 1);
  EXPECT_EQ(r.at("layer4.1.bn2.bias"), 4);
  EXPECT_EQ(r.at("fc.weight"), 5);
  const auto c = ids_of({"features.0.0.weight", "features.1.0.block.0.weight", "features.2.1.weight",
                         "features.7.2.layer_scale", "classifier.0.weight", "classifier.2.bias"});
  EXPECT_EQ(c.at("features.0.0.weight"), 0);
  EXPECT_EQ(c.at("features.1.0.block.0.weight"), 1);
  EXPECT_EQ(c.at("features.7.2.layer_scale"), 7);
  EXPECT_EQ(c.at("classifier.2.bias"), 8);
  const auto m =
      ids_of({"fc1.weight", "fc1.bias", "fc2.weight", "fc3.weight"});  // the MLP: top-level modules
  EXPECT_EQ(m.at("fc1.bias"), 0);
  EXPECT_EQ(m.at("fc3.weight"), 2);
}

// One step of lr 1 with gradient 1 (no momentum, no decay): each parameter moves by its group's LR.
template <class Opt, class Options>
void expect_group_lrs(Options o, const std::string& what) {
  o.layer_decay = 0.5;
  o.weight_decay = 0.0;
  std::vector<NamedParameter> params;
  for (const char* name : {"conv1.weight", "layer1.0.weight", "layer3.0.weight", "fc.weight"})
    params.push_back({name, Variable(Tensor::zeros({2, 2}, DType::f64), true)});
  Opt opt(params, o);
  std::map<std::string, double> scale;
  for (const ParamGroup& g : opt.param_groups())
    for (const NamedParameter& p : g.params) scale[p.name] = g.lr_scale;
  EXPECT_DOUBLE_EQ(scale.at("conv1.weight"), 1.0 / 32) << what;  // layer 0 of 5
  EXPECT_DOUBLE_EQ(scale.at("layer3.0.weight"), 0.25) << what;
  EXPECT_DOUBLE_EQ(scale.at("fc.weight"), 1.0) << what;
  for (NamedParameter& p : params) p.param.grad() = Tensor::full({2, 2}, 1.0, DType::f64);
  opt.set_lr(1.0);
  opt.step();
  const double step_of_layer1 = -params[1].param.data().template to_vector<double>()[0];
  const double step_of_head = -params[3].param.data().template to_vector<double>()[0];
  EXPECT_NEAR(step_of_layer1 / step_of_head, 1.0 / 16, 1e-12) << what;  // the same update, lr x 1/16
}

TEST(LayerDecay, EveryOptimizerHonoursTheGroupScale) {
  expect_group_lrs<Sgd>(SgdOptions{}, "sgd");
  expect_group_lrs<AdamW>(AdamWOptions{}, "adamw");
  LambOptions lamb;
  lamb.max_grad_norm = 0.0;
  expect_group_lrs<Lamb>(lamb, "lamb");
  LarsOptions lars;
  lars.momentum = 0.0;
  expect_group_lrs<Lars>(lars, "lars");
}

}  // namespace
}  // namespace trainer
