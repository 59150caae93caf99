#include "nn/models/vit.h"

#include <cmath>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "nn/functional.h"
#include "nn/init.h"
#include "nn/models/vit_position_embedding.h"

namespace trainer {
namespace {

constexpr double kLayerNormEps = 1e-6;  // torchvision's partial(nn.LayerNorm, eps=1e-6)

std::shared_ptr<Dropout> dropout_or_null(double p, const std::shared_ptr<Generator>& gen) {
  return p > 0.0 ? std::make_shared<Dropout>(p, gen) : nullptr;
}

// PyTorch's type promotion where the ViT joins tensors: under autocast conv_proj and the linears give
// half outputs while the class token, the position embedding and so the residual stream stay f32, and
// torch.cat and + promote to the wider dtype. Without autocast both sides already agree.
std::vector<Variable> promoted(const std::vector<Variable>& parts) {
  DType wide = parts[0].dtype();
  for (const Variable& p : parts)
    if (dtype_size(p.dtype()) > dtype_size(wide)) wide = p.dtype();
  std::vector<Variable> out;
  for (const Variable& p : parts) out.push_back(F::to_dtype(p, wide));
  return out;
}

Variable add_promoted(const Variable& a, const Variable& b) {
  // F::add widens a half operand of the same shape as it reads it (no separate cast pass).
  if (a.shape() == b.shape()) return F::add(a, b);
  const std::vector<Variable> ab = promoted({a, b});
  return F::add(ab[0], ab[1]);
}

// A Linear applied to every token: F::linear takes [rows, features].
Variable per_token(Linear& linear, const Variable& x) {
  const Variable y = linear.forward(F::reshape(x, {x.size(0) * x.size(1), x.size(2)}));
  return F::reshape(y, {x.size(0), x.size(1), linear.out_features()});
}

}  // namespace

ViTConfig ViTConfig::b_16() { return ViTConfig{}; }

ViTConfig ViTConfig::s_16() {
  ViTConfig c;
  c.num_heads = 6;
  c.hidden_dim = 384;
  c.mlp_dim = 1536;
  return c;
}

ViTMlpBlock::ViTMlpBlock(int64_t dim, int64_t mlp_dim, double dropout,
                         const std::shared_ptr<Generator>& dropout_gen, Generator& gen) {
  fc1_ = register_module("0", std::make_shared<Linear>(dim, mlp_dim, true, gen));
  register_module("1", std::make_shared<GELU>());
  if ((dropout1_ = dropout_or_null(dropout, dropout_gen))) register_module("2", dropout1_);
  fc2_ = register_module("3", std::make_shared<Linear>(mlp_dim, dim, true, gen));
  if ((dropout2_ = dropout_or_null(dropout, dropout_gen))) register_module("4", dropout2_);
  for (Linear* fc : {fc1_.get(), fc2_.get()}) {
    init::xavier_uniform_(fc->weight().data(), gen);
    init::normal_(fc->bias().data(), 0.0, 1e-6, gen);
  }
}

Variable ViTMlpBlock::forward(const Variable& x) {
  Variable h = F::gelu(per_token(*fc1_, x));  // [N, T, M]
  if (dropout1_) h = dropout1_->forward(h);
  h = per_token(*fc2_, h);  // [N, T, D]
  return dropout2_ ? dropout2_->forward(h) : h;
}

ViTEncoderBlock::ViTEncoderBlock(const ViTConfig& c, const std::shared_ptr<Generator>& dropout_gen,
                                 Generator& gen) {
  ln_1_ = register_module("ln_1", std::make_shared<LayerNorm>(c.hidden_dim, kLayerNormEps));
  self_attention_ =
      register_module("self_attention", std::make_shared<MultiheadAttention>(c.hidden_dim, c.num_heads, gen));
  if ((dropout_ = dropout_or_null(c.dropout, dropout_gen))) register_module("dropout", dropout_);
  ln_2_ = register_module("ln_2", std::make_shared<LayerNorm>(c.hidden_dim, kLayerNormEps));
  ln_1_->set_output_feeds_matmuls(true);  // into the attention's input projection
  ln_2_->set_output_feeds_matmuls(true);  // into the MLP's first linear
  mlp_ = register_module("mlp",
                         std::make_shared<ViTMlpBlock>(c.hidden_dim, c.mlp_dim, c.dropout, dropout_gen, gen));
}

Variable ViTEncoderBlock::forward(const Variable& x) {
  const auto [h, branch] = forward_to_mlp_branch(x, ln_1_->forward(x));
  return add_promoted(h, branch);
}

std::pair<Variable, Variable> ViTEncoderBlock::forward_to_mlp_branch(const Variable& x,
                                                                     const Variable& ln_1_of_x) {
  Variable attended = self_attention_->forward(ln_1_of_x);
  if (dropout_) attended = dropout_->forward(attended);
  const auto [h, normalised] = ln_2_->forward_after_add(x, attended);
  return {h, mlp_->forward(normalised)};
}

ViTEncoder::ViTEncoder(const ViTConfig& c, const std::shared_ptr<Generator>& dropout_gen, Generator& gen) {
  const int64_t tokens = 1 + c.grid() * c.grid();
  pos_embedding_ = register_parameter("pos_embedding", Tensor::empty({1, tokens, c.hidden_dim}));
  init::normal_(pos_embedding_.data(), 0.0, 0.02, gen);
  if ((dropout_ = dropout_or_null(c.dropout, dropout_gen))) register_module("dropout", dropout_);
  layers_ = register_module("layers", std::make_shared<NamedSequential>());
  for (int64_t i = 0; i < c.num_layers; ++i) {
    blocks_.push_back(std::make_shared<ViTEncoderBlock>(c, dropout_gen, gen));
    layers_->add("encoder_layer_" + std::to_string(i), blocks_.back());
  }
  ln_ = register_module("ln", std::make_shared<LayerNorm>(c.hidden_dim, kLayerNormEps));
  ln_->set_output_feeds_matmuls(true);  // the class token's state into the head
}

Variable ViTEncoder::forward(const Variable& x) {
  if (x.dim() != 3 || x.size(1) != pos_embedding_.size(1) || x.size(2) != pos_embedding_.size(2))
    throw std::invalid_argument("ViT encoder expects tokens " + shape_str(pos_embedding_.shape()) +
                                " per sample, got " + shape_str(x.shape()));
  Variable h = add_promoted(x, pos_embedding_);  // broadcast over the batch
  if (dropout_) h = dropout_->forward(h);
  // layers_ then ln_, with each block's last residual add done by the norm after it (the next block's
  // ln_1, the last one's ln): one pass writes the stream and its normalised copy.
  Variable normalised = blocks_.front()->ln_1().forward(h);
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const auto [stream, mlp_branch] = blocks_[i]->forward_to_mlp_branch(h, normalised);
    LayerNorm& next = i + 1 < blocks_.size() ? blocks_[i + 1]->ln_1() : *ln_;
    std::tie(h, normalised) = next.forward_after_add(stream, mlp_branch);
  }
  return normalised;
}

VisionTransformer::VisionTransformer(const ViTConfig& c, std::shared_ptr<Generator> dropout_gen,
                                     Generator& gen)
    : config_(c) {
  const bool sizes_ok = c.image_size > 0 && c.patch_size > 0 && c.image_size % c.patch_size == 0 &&
                        c.num_layers > 0 && c.num_heads > 0 && c.hidden_dim % c.num_heads == 0 &&
                        c.mlp_dim > 0 && c.in_channels > 0 && c.num_classes > 0;
  if (!sizes_ok)
    throw std::invalid_argument("VisionTransformer: image_size " + std::to_string(c.image_size) +
                                " must be a multiple of patch_size " + std::to_string(c.patch_size) +
                                ", width " + std::to_string(c.hidden_dim) + " a multiple of heads " +
                                std::to_string(c.num_heads) + ", and depth " + std::to_string(c.num_layers) +
                                ", mlp_dim " + std::to_string(c.mlp_dim) + ", channels and classes positive");
  // torchvision assigns class_token before the encoder, but as a parameter of the root it precedes
  // every child in the state dict either way.
  class_token_ = register_parameter("class_token", Tensor::zeros({1, 1, c.hidden_dim}));
  const int p = static_cast<int>(c.patch_size);
  conv_proj_ = register_module(
      "conv_proj", std::make_shared<Conv2d>(c.in_channels, c.hidden_dim, p, p, 0, 1, 1, true, gen));
  encoder_ = register_module("encoder", std::make_shared<ViTEncoder>(c, dropout_gen, gen));
  heads_ = register_module("heads", std::make_shared<NamedSequential>());
  auto head = heads_->add("head", std::make_shared<Linear>(c.hidden_dim, c.num_classes, true, gen));

  // torchvision's re-initialisation of the patch embedding and the head.
  // torch.nn.init.trunc_normal_'s bounds are absolute (+-2), not multiples of std (nn/init.h).
  init::trunc_normal_(conv_proj_->weight().data(), gen, 0.0,
                      std::sqrt(1.0 / static_cast<double>(c.in_channels * p * p)));
  init::zeros_(conv_proj_->bias().data());
  init::zeros_(head->weight().data());
  init::zeros_(head->bias().data());
}

std::optional<Tensor> VisionTransformer::adapt_loaded_tensor(const std::string& name,
                                                             const Tensor& stored) const {
  // Only the position embedding depends on the image size; a different width is a different model.
  const bool embedding_of_this_width =
      stored.shape().size() == 3 && stored.size(0) == 1 && stored.size(2) == config_.hidden_dim;
  if (name != "encoder.pos_embedding" || !embedding_of_this_width) return std::nullopt;
  return interpolate_position_embedding(stored, config_.grid());
}

Variable VisionTransformer::forward(const Variable& x) {
  const int64_t size = config_.image_size;
  if (x.dim() != 4 || x.size(1) != config_.in_channels || x.size(2) != size || x.size(3) != size)
    throw std::invalid_argument("ViT was built for images [N, " + std::to_string(config_.in_channels) + ", " +
                                std::to_string(size) + ", " + std::to_string(size) + "], got " +
                                shape_str(x.shape()));
  const int64_t n = x.size(0), d = config_.hidden_dim, g = config_.grid();
  Variable patches = conv_proj_->forward(x);                            // [N, D, g, g]
  patches = F::permute(F::reshape(patches, {n, d, g * g}), {0, 2, 1});  // [N, g*g, D]
  const Variable tokens =
      F::cat(promoted({F::expand(class_token_, {n, 1, d}), patches}), 1);  // [N, 1 + g*g, D]
  const Variable encoded = encoder_->forward(tokens);
  const Variable cls = F::reshape(F::slice(encoded, 1, 0, 1), {n, d});  // the class token's state
  return heads_->forward(cls);
}

std::shared_ptr<Module> make_vit(ViTVariant variant, const ModelOptions& o) {
  ViTConfig c = variant == ViTVariant::s_16 ? ViTConfig::s_16() : ViTConfig::b_16();
  if (variant == ViTVariant::small) {
    c.patch_size = o.patch_size;
    c.num_layers = o.depth;
    c.num_heads = o.heads;
    c.hidden_dim = o.width;
    c.mlp_dim = o.mlp_dim;
  }
  c.image_size = o.image_size;
  c.in_channels = o.in_channels;
  c.num_classes = o.num_classes;
  c.dropout = o.dropout;
  Generator gen(o.seed);
  return std::make_shared<VisionTransformer>(c, dropout_generator_for(o), gen);
}

}  // namespace trainer
