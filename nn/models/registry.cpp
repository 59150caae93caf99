#include "nn/models/registry.h"

#include <cmath>
#include <map>
#include <stdexcept>

#include "nn/models/cnn.h"
#include "nn/models/convnext.h"
#include "nn/models/mlp.h"
#include "nn/models/resnet.h"
#include "nn/models/vit.h"

namespace trainer {
namespace {

const std::map<std::string, ModelFactory>& registry() {
  static const std::map<std::string, ModelFactory> models = {
      {"mlp", make_mlp},
      {"cnn", make_cnn},
      {"resnet18", [](const ModelOptions& o) { return make_resnet(ResNetDepth::resnet18, o); }},
      {"resnet34", [](const ModelOptions& o) { return make_resnet(ResNetDepth::resnet34, o); }},
      {"resnet50", [](const ModelOptions& o) { return make_resnet(ResNetDepth::resnet50, o); }},
      {"vit_b_16", [](const ModelOptions& o) { return make_vit(ViTVariant::b_16, o); }},
      {"vit_s_16", [](const ModelOptions& o) { return make_vit(ViTVariant::s_16, o); }},
      {"vit", [](const ModelOptions& o) { return make_vit(ViTVariant::small, o); }},
      {"convnext_tiny", make_convnext_tiny},
      {"convnext", make_convnext},
  };
  return models;
}

std::string joined_names() {
  std::string out;
  for (const auto& name : model_names()) out += (out.empty() ? "" : ", ") + name;
  return out;
}

}  // namespace

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const auto& [name, factory] : registry()) names.push_back(name);
  return names;
}

bool model_has_stem_choice(const std::string& name) { return name.starts_with("resnet"); }

std::string classifier_prefix(const std::string& name) {
  if (name.starts_with("resnet")) return "fc.";
  if (name.starts_with("vit")) return "heads.head.";
  if (name.starts_with("convnext")) return "classifier.2.";
  if (name == "mlp") return "fc3.";
  if (name == "cnn") return "fc2.";
  throw std::invalid_argument("classifier_prefix: unknown model '" + name + "'");
}

std::shared_ptr<Generator> dropout_generator_for(const ModelOptions& options) {
  return options.dropout_generator ? options.dropout_generator
                                   : std::make_shared<Generator>(options.seed ^ 0x5eed0d0full);
}

std::shared_ptr<Module> create_model(const ModelOptions& options) {
  const auto it = registry().find(options.name);
  if (it == registry().end())
    throw std::invalid_argument("unknown model '" + options.name + "'; known models: " + joined_names());
  if (options.in_channels <= 0 || options.num_classes <= 0)
    throw std::invalid_argument("model '" + options.name + "': in_channels (" +
                                std::to_string(options.in_channels) + ") and num_classes (" +
                                std::to_string(options.num_classes) + ") must be positive");
  if (options.stem != "imagenet" && options.stem != "cifar")
    throw std::invalid_argument("model '" + options.name + "': unknown stem '" + options.stem +
                                "'; known stems: cifar, imagenet");
  if (!(options.dropout >= 0.0 && options.dropout < 1.0))
    throw std::invalid_argument("model '" + options.name + "': dropout must be in [0, 1), got " +
                                std::to_string(options.dropout));
  if (options.drop_path && !(*options.drop_path >= 0.0 && *options.drop_path < 1.0))
    throw std::invalid_argument("model '" + options.name + "': drop_path must be in [0, 1), got " +
                                std::to_string(*options.drop_path));
  if (!(options.layer_scale > 0.0 && std::isfinite(options.layer_scale)) || options.stem_patch < 0)
    throw std::invalid_argument("model '" + options.name + "': layer_scale must be positive and stem_patch " +
                                "non-negative (0: the model's own)");
  return it->second(options);
}

}  // namespace trainer
