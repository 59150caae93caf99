#include "app/commands/export/onnx_models.h"

#include <stdexcept>

#include "app/commands/export/onnx_layers.h"

namespace trainer {
namespace {

namespace L = onnx_layers;
using Ints = std::vector<int64_t>;

std::string mlp(OnnxGraph& g, const std::string& x) {
  std::string h = g.node("Flatten", {x}, {{"axis", int64_t{1}}});  // [N, C*H*W]
  h = L::relu(g, L::linear(g, h, "fc1"));
  h = L::relu(g, L::linear(g, h, "fc2"));
  return L::linear(g, h, "fc3");
}

std::string cnn(OnnxGraph& g, const std::string& x) {
  std::string h = L::max_pool(g, L::relu(g, L::batch_norm(g, L::conv(g, x, "conv1", 1, 1), "bn1")), 2, 2, 0);
  h = L::max_pool(g, L::relu(g, L::batch_norm(g, L::conv(g, h, "conv2", 1, 1), "bn2")), 2, 2, 0);
  h = L::relu(g, L::linear(g, g.node("Flatten", {h}, {{"axis", int64_t{1}}}), "fc1"));
  return L::linear(g, h, "fc2");  // dropout is the identity in eval mode
}

// torchvision's BasicBlock or Bottleneck (v1.5: the stride on the 3x3 conv) at `prefix`.
std::string resnet_block(OnnxGraph& g, const std::string& x, const std::string& prefix, int64_t stride) {
  const auto conv_bn = [&](const std::string& in, const std::string& conv, const std::string& bn, int64_t s,
                           int64_t pad) {
    return L::batch_norm(g, L::conv(g, in, prefix + conv, s, pad), prefix + bn);
  };
  std::string h;
  if (g.has_weight(prefix + ".conv3.weight")) {  // Bottleneck
    h = L::relu(g, conv_bn(x, ".conv1", ".bn1", 1, 0));
    h = L::relu(g, conv_bn(h, ".conv2", ".bn2", stride, 1));
    h = conv_bn(h, ".conv3", ".bn3", 1, 0);
  } else {
    h = L::relu(g, conv_bn(x, ".conv1", ".bn1", stride, 1));
    h = conv_bn(h, ".conv2", ".bn2", 1, 1);
  }
  const std::string identity = g.has_weight(prefix + ".downsample.0.weight")
                                   ? conv_bn(x, ".downsample.0", ".downsample.1", stride, 0)
                                   : x;
  return L::relu(g, g.node("Add", {h, identity}));
}

std::string resnet(OnnxGraph& g, const std::string& x, const ModelOptions& o) {
  const bool imagenet_stem = o.stem == "imagenet";
  std::string h = L::relu(
      g, L::batch_norm(g, L::conv(g, x, "conv1", imagenet_stem ? 2 : 1, imagenet_stem ? 3 : 1), "bn1"));
  if (imagenet_stem) h = L::max_pool(g, h, 3, 2, 1);
  for (int stage = 1; stage <= 4; ++stage)
    for (int b = 0; g.has_weight("layer" + std::to_string(stage) + "." + std::to_string(b) + ".conv1.weight");
         ++b)
      h = resnet_block(g, h, "layer" + std::to_string(stage) + "." + std::to_string(b),
                       b == 0 && stage > 1 ? 2 : 1);
  return L::linear(g, L::global_avg_pool_flat(g, h), "fc");
}

constexpr float kTransformerEps = 1e-6f;  // torchvision's ViT and ConvNeXt LayerNorms

std::string vit_block(OnnxGraph& g, const std::string& x, const std::string& prefix, int64_t heads,
                      F::GeluApproximation gelu) {
  const std::string attended = L::self_attention(g, L::layer_norm(g, x, prefix + ".ln_1", kTransformerEps),
                                                 prefix + ".self_attention", heads);
  const std::string h = g.node("Add", {x, attended});
  std::string m =
      L::linear_tokens(g, L::layer_norm(g, h, prefix + ".ln_2", kTransformerEps), prefix + ".mlp.0");
  m = L::linear_tokens(g, L::gelu(g, m, gelu), prefix + ".mlp.3");
  return g.node("Add", {h, m});
}

std::string vit(OnnxGraph& g, const std::string& x, const ModelOptions& o, F::GeluApproximation gelu) {
  const int64_t heads = o.name == "vit_b_16" ? 12 : o.name == "vit_s_16" ? 6 : o.heads;
  const Tensor& proj = g.weight_tensor("conv_proj.weight");  // [D, C, p, p]
  const int64_t d = proj.size(0), patch = proj.size(2);
  const std::string patches = L::conv(g, x, "conv_proj", patch, 0);  // [N, D, g, g]
  const std::string tokens =
      g.node("Transpose", {g.node("Reshape", {patches, g.int64s("patches_shape", {0, d, -1})})},
             {{"perm", Ints{0, 2, 1}}});
  // The class token [1, 1, D] repeated over the batch: Expand to [N, 1, D], N read from the input.
  const std::string batch =
      g.node("Slice", {g.node("Shape", {x}), g.int64s("start", {0}), g.int64s("end", {1})});
  const std::string cls_shape =
      g.node("Concat", {batch, g.int64s("cls_dims", {1, d})}, {{"axis", int64_t{0}}});
  const std::string cls = g.node("Expand", {g.weight("class_token"), cls_shape});
  std::string h = g.node("Concat", {cls, tokens}, {{"axis", int64_t{1}}});  // [N, 1 + T, D]
  h = g.node("Add", {h, g.weight("encoder.pos_embedding")});
  for (int i = 0; g.has_weight("encoder.layers.encoder_layer_" + std::to_string(i) + ".ln_1.weight"); ++i)
    h = vit_block(g, h, "encoder.layers.encoder_layer_" + std::to_string(i), heads, gelu);
  h = L::layer_norm(g, h, "encoder.ln", kTransformerEps);
  const std::string first = g.node("Gather", {h, g.int64s("class_index", {0})}, {{"axis", int64_t{1}}});
  return L::linear(g, g.node("Reshape", {first, g.int64s("cls_state", {-1, d})}), "heads.head");
}

// torchvision's CNBlock: x + layer_scale * MLP(LayerNorm(dwconv7x7(x))), the MLP over each pixel.
std::string convnext_block(OnnxGraph& g, const std::string& x, const std::string& prefix,
                           F::GeluApproximation gelu) {
  const int64_t channels = g.weight_tensor(prefix + ".block.0.weight").size(0);
  std::string h = L::conv(g, x, prefix + ".block.0", 1, 3, channels);
  h = g.node("Transpose", {h}, {{"perm", Ints{0, 2, 3, 1}}});  // [N, H, W, C]
  h = L::layer_norm(g, h, prefix + ".block.2", kTransformerEps);
  h = L::linear_tokens(g, L::gelu(g, L::linear_tokens(g, h, prefix + ".block.3"), gelu), prefix + ".block.5");
  h = g.node("Transpose", {h}, {{"perm", Ints{0, 3, 1, 2}}});  // [N, C, H, W]
  h = g.node("Mul",
             {h, g.weight(prefix + ".layer_scale")});  // [C, 1, 1] broadcast; stochastic depth: identity
  return g.node("Add", {x, h}, {}, prefix);
}

std::string convnext(OnnxGraph& g, const std::string& x, F::GeluApproximation gelu) {
  const int64_t patch = g.weight_tensor("features.0.0.weight").size(2);
  std::string h =
      L::layer_norm_2d(g, L::conv(g, x, "features.0.0", patch, 0), "features.0.1", kTransformerEps);
  for (int stage = 0;; ++stage) {
    const std::string blocks = "features." + std::to_string(2 * stage + 1);
    if (!g.has_weight(blocks + ".0.layer_scale")) break;
    for (int b = 0; g.has_weight(blocks + "." + std::to_string(b) + ".layer_scale"); ++b)
      h = convnext_block(g, h, blocks + "." + std::to_string(b), gelu);
    const std::string down = "features." + std::to_string(2 * stage + 2);
    if (g.has_weight(down + ".1.weight"))
      h = L::conv(g, L::layer_norm_2d(g, h, down + ".0", kTransformerEps), down + ".1", 2, 0);
  }
  h = g.node("GlobalAveragePool", {h});  // [N, C, 1, 1]
  h = g.node("Flatten", {L::layer_norm_2d(g, h, "classifier.0", kTransformerEps)}, {{"axis", int64_t{1}}});
  return L::linear(g, h, "classifier.2");
}

}  // namespace

std::string emit_model(OnnxGraph& g, const std::string& images, const ModelOptions& o,
                       F::GeluApproximation gelu_form) {
  if (o.name == "mlp") return mlp(g, images);
  if (o.name == "cnn") return cnn(g, images);
  if (o.name.starts_with("resnet")) return resnet(g, images, o);
  if (o.name == "vit" || o.name == "vit_s_16" || o.name == "vit_b_16") return vit(g, images, o, gelu_form);
  if (o.name.starts_with("convnext")) return convnext(g, images, gelu_form);
  throw std::runtime_error("export: no ONNX emitter for model '" + o.name + "'");
}

}  // namespace trainer
