#pragma once
// The Vision Transformer with torchvision's structure, module names and initialisation
// (torchvision.models.VisionTransformer), so that state dicts load into vit_b_16 & co. unchanged:
//   class_token [1, 1, D], conv_proj (C -> D, kernel = stride = patch),
//   encoder.pos_embedding [1, 1 + (image/patch)^2, D],
//   encoder.layers.encoder_layer_{i}.{ln_1, self_attention, ln_2, mlp.0, mlp.3}, encoder.ln,
//   heads.head (D -> classes).
// Pre-norm encoder blocks: x + attention(ln_1(x)), then x + mlp(ln_2(x)); LayerNorm eps 1e-6; the
// class token's final state is classified.
#include <memory>
#include <utility>
#include <vector>

#include "nn/models/registry.h"
#include "nn/modules/layers.h"

namespace trainer {

struct ViTConfig {
  int64_t image_size = 224;  // height = width; a multiple of patch_size
  int64_t patch_size = 16;
  int64_t in_channels = 3;
  int64_t num_layers = 12;
  int64_t num_heads = 12;
  int64_t hidden_dim = 768;  // D, the token width; a multiple of num_heads
  int64_t mlp_dim = 3072;
  int64_t num_classes = 1000;
  double dropout = 0.0;  // torchvision's `dropout`: after the position embedding, attention and MLP

  static ViTConfig b_16();  // torchvision's vit_b_16: 12 layers, 12 heads, D 768, MLP 3072
  static ViTConfig s_16();  // the same class at 12 layers, 6 heads, D 384, MLP 1536 (DeiT-S / ViT-S)
  int64_t grid() const { return image_size / patch_size; }  // patches per side
};

// torchvision's MLPBlock: 0 Linear (D -> M), 1 GELU, 2 Dropout, 3 Linear (M -> D), 4 Dropout; the
// linears xavier_uniform with normal(std 1e-6) biases.
class ViTMlpBlock : public Module {
 public:
  ViTMlpBlock(int64_t dim, int64_t mlp_dim, double dropout, const std::shared_ptr<Generator>& dropout_gen,
              Generator& gen);
  Variable forward(const Variable& x) override;  // [N, T, D] -> [N, T, D]

 private:
  std::shared_ptr<Linear> fc1_, fc2_;
  std::shared_ptr<Dropout> dropout1_, dropout2_;  // null when dropout == 0
};

class ViTEncoderBlock : public Module {
 public:
  ViTEncoderBlock(const ViTConfig& config, const std::shared_ptr<Generator>& dropout_gen, Generator& gen);
  Variable forward(const Variable& x) override;  // [N, T, D] -> [N, T, D]
  // The block given ln_1(x) already (the encoder computes it with the residual add before it, see
  // LayerNorm::forward_after_add): {h, mlp(ln_2(h))} with h = x + attention(ln_1(x)), so that the next
  // norm can take the block's last add into its pass as well. forward(x) = h + that branch.
  std::pair<Variable, Variable> forward_to_mlp_branch(const Variable& x, const Variable& ln_1_of_x);
  LayerNorm& ln_1() { return *ln_1_; }

 private:
  std::shared_ptr<LayerNorm> ln_1_, ln_2_;
  std::shared_ptr<MultiheadAttention> self_attention_;
  std::shared_ptr<Dropout> dropout_;  // null when dropout == 0
  std::shared_ptr<ViTMlpBlock> mlp_;
};

// Adds the position embedding (a parameter of its own: encoder.pos_embedding), runs the blocks, and
// normalises the result.
class ViTEncoder : public Module {
 public:
  ViTEncoder(const ViTConfig& config, const std::shared_ptr<Generator>& dropout_gen, Generator& gen);
  Variable forward(const Variable& x) override;  // [N, 1 + T, D] -> same
  Variable& pos_embedding() { return pos_embedding_; }

 private:
  Variable pos_embedding_;  // [1, 1 + T, D]
  std::shared_ptr<Dropout> dropout_;
  std::shared_ptr<NamedSequential> layers_;
  std::vector<std::shared_ptr<ViTEncoderBlock>> blocks_;  // layers_' modules, in order
  std::shared_ptr<LayerNorm> ln_;
};

class VisionTransformer : public Module {
 public:
  VisionTransformer(const ViTConfig& config, std::shared_ptr<Generator> dropout_gen, Generator& gen);
  Variable forward(const Variable& x) override;  // [N, C, H, W] -> [N, classes]

  const ViTConfig& config() const { return config_; }
  Variable& class_token() { return class_token_; }
  // encoder.pos_embedding of weights trained at another image size, resized bicubically to this
  // model's patch grid (torchvision's interpolate_embeddings).
  std::optional<Tensor> adapt_loaded_tensor(const std::string& name, const Tensor& stored) const override;
  ViTEncoder& encoder() { return *encoder_; }

 private:
  ViTConfig config_;
  Variable class_token_;  // [1, 1, D]
  std::shared_ptr<Conv2d> conv_proj_;
  std::shared_ptr<ViTEncoder> encoder_;
  std::shared_ptr<NamedSequential> heads_;
};

enum class ViTVariant : uint8_t { b_16, s_16, small };

// vit_b_16 and vit_s_16 take in_channels, num_classes, image_size (a multiple of 16; torchvision's
// weights are for 224) and dropout from the options; the small one also patch_size, depth, heads,
// mlp_dim and width (D).
std::shared_ptr<Module> make_vit(ViTVariant variant, const ModelOptions& options);

}  // namespace trainer
