#include "nn/models/convnext.h"

#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

#include "nn/functional.h"

namespace trainer {
namespace {

constexpr double kNormEps = 1e-6;  // torchvision's ConvNeXt passes eps=1e-6 to every LayerNorm

std::shared_ptr<LayerNorm> layer_norm_2d(int64_t channels) {
  return std::make_shared<LayerNorm>(channels, kNormEps, true, LayerNormOver::channels);
}

}  // namespace

CNBlock::CNBlock(int64_t dim, double layer_scale, double drop_path, std::shared_ptr<Generator> drop_path_gen,
                 Generator& gen)
    : dim_(dim) {
  // The children of `block` have torchvision's indices (block.0 ... block.6); forward calls them one by
  // one instead of through the Sequential, to apply the layer scale, drop path and residual add before
  // the last permute (see forward).
  auto block = register_module("block", std::make_shared<Sequential>());
  dwconv_ = block->push_back(std::make_shared<Conv2d>(dim, dim, 7, 1, 3, 1, dim, true, gen));
  to_nhwc_ = block->push_back(std::make_shared<Permute>(std::vector<int>{0, 2, 3, 1}));
  norm_ = block->push_back(std::make_shared<LayerNorm>(dim, kNormEps));
  fc1_ = block->push_back(std::make_shared<Linear>(dim, 4 * dim, true, gen));
  gelu_ = block->push_back(std::make_shared<GELU>());
  fc2_ = block->push_back(std::make_shared<Linear>(4 * dim, dim, true, gen));
  to_nchw_ = block->push_back(std::make_shared<Permute>(std::vector<int>{0, 3, 1, 2}));
  layer_scale_ = register_parameter("layer_scale", Tensor::full({dim, 1, 1}, layer_scale));
  stochastic_depth_ = register_module("stochastic_depth",
                                      std::make_shared<StochasticDepth>(drop_path, std::move(drop_path_gen)));
}

Variable CNBlock::forward(const Variable& x) {
  // With x channels-last (every block's input is: the stem's LayerNorm2d makes it so and every op after
  // keeps it), the permutes to [N, H, W, C] are free views of contiguous memory, and so is everything
  // after them: LayerNorm over the last dimension, the Linears' [N*H*W, C] GEMMs, and the layer scale,
  // drop path and residual add on contiguous NHWC operands, whose results both backends write NHWC.
  // The last permute gives back [N, C, H, W] with channels-last strides. torchvision multiplies by
  // layer_scale [C, 1, 1] after permuting back; [C] over NHWC is the same product, and doing it before
  // keeps the broadcast ops from writing an NCHW result. Copies happen only for an NCHW x (the first
  // permute then is not contiguous, and the LayerNorm copies it).
  Variable h = to_nhwc_->forward(dwconv_->forward(x));                  // [N, H, W, C]
  h = fc2_->forward(gelu_->forward(fc1_->forward(norm_->forward(h))));  // [N, H, W, 4C] inside
  // Layer scale, drop path and the residual add in one op (one kernel each way on a GPU). Under autocast
  // h is half and layer_scale f32 (a master weight); its gradient comes back in f32.
  h = stochastic_depth_->add_scaled_branch(to_nhwc_->forward(x), h, F::reshape(layer_scale_, {dim_}));
  return to_nchw_->forward(h);  // [N, C, H, W], channels-last
}

ConvNeXtConfig ConvNeXtConfig::tiny() { return ConvNeXtConfig{}; }

ConvNeXtConfig ConvNeXtConfig::small_images() {
  ConvNeXtConfig c;
  c.depths = {2, 2, 6, 2};
  c.widths = {48, 96, 192, 384};
  c.stem_patch = 2;
  return c;
}

ConvNeXt::ConvNeXt(const ConvNeXtConfig& c, std::shared_ptr<Generator> drop_path_gen, Generator& gen) {
  if (c.depths.empty() || c.depths.size() != c.widths.size())
    throw std::invalid_argument("ConvNeXt: depths and widths must be non-empty and of the same length (got " +
                                std::to_string(c.depths.size()) + " and " + std::to_string(c.widths.size()) +
                                ")");
  for (size_t i = 0; i < c.depths.size(); ++i)
    if (c.depths[i] < 1 || c.widths[i] < 1)
      throw std::invalid_argument("ConvNeXt: stage " + std::to_string(i) + " has depth " +
                                  std::to_string(c.depths[i]) + " and width " + std::to_string(c.widths[i]) +
                                  "; both must be positive");
  if (c.stem_patch < 1) throw std::invalid_argument("ConvNeXt: stem_patch must be positive");
  if (!(c.stochastic_depth_prob >= 0.0 && c.stochastic_depth_prob < 1.0))
    throw std::invalid_argument("ConvNeXt: drop_path must be in [0, 1), got " +
                                std::to_string(c.stochastic_depth_prob));

  features_ = register_module("features", std::make_shared<Sequential>());
  const int patch = static_cast<int>(c.stem_patch);
  auto stem = features_->push_back(std::make_shared<Sequential>());
  stem->push_back(std::make_shared<Conv2d>(c.in_channels, c.widths[0], patch, patch, 0, 1, 1, true, gen));
  stem->push_back(layer_norm_2d(c.widths[0]));

  const int64_t total_blocks = std::accumulate(c.depths.begin(), c.depths.end(), int64_t{0});
  int64_t block_id = 0;
  for (size_t i = 0; i < c.depths.size(); ++i) {
    auto stage = features_->push_back(std::make_shared<Sequential>());
    for (int64_t b = 0; b < c.depths[i]; ++b, ++block_id) {
      // torchvision: linear from 0 at the first block to stochastic_depth_prob at the last.
      const double p = total_blocks > 1
                           ? c.stochastic_depth_prob * static_cast<double>(block_id) / (total_blocks - 1.0)
                           : 0.0;
      stage->push_back(std::make_shared<CNBlock>(c.widths[i], c.layer_scale, p, drop_path_gen, gen));
    }
    if (i + 1 < c.depths.size()) {
      auto downsample = features_->push_back(std::make_shared<Sequential>());
      downsample->push_back(layer_norm_2d(c.widths[i]));
      downsample->push_back(std::make_shared<Conv2d>(c.widths[i], c.widths[i + 1], 2, 2, 0, 1, 1, true, gen));
    }
  }
  avgpool_ = register_module("avgpool", std::make_shared<AdaptiveAvgPool2d>(1));
  classifier_ = register_module("classifier", std::make_shared<Sequential>());
  classifier_->push_back(layer_norm_2d(c.widths.back()));
  classifier_->push_back(std::make_shared<Flatten>(1));
  classifier_->push_back(std::make_shared<Linear>(c.widths.back(), c.num_classes, true, gen));

  // torchvision's re-initialisation; LayerNorms keep weight 1, bias 0.
  for (auto& [name, m] : named_modules()) {
    Variable *weight = nullptr, *bias = nullptr;
    if (auto* conv = dynamic_cast<Conv2d*>(m)) {
      weight = &conv->weight();
      bias = &conv->bias();
    } else if (auto* linear = dynamic_cast<Linear*>(m)) {
      weight = &linear->weight();
      bias = &linear->bias();
    }
    if (!weight) continue;
    init::trunc_normal_(weight->data(), gen, 0.0, 0.02);
    if (bias->defined()) init::zeros_(bias->data());
  }
}

Variable ConvNeXt::forward(const Variable& x) {
  // The image is laid out channels-last once, so that the whole network runs so (see CNBlock::forward):
  // it is the smallest tensor there is to convert (3 channels), and half-precision runs already get
  // channels-last batches from the trainer (PrecisionPolicy::input_format), for which this is a no-op.
  Variable h = features_->forward(F::contiguous(x, MemoryFormat::channels_last));  // [N, C_last, h, w]
  return classifier_->forward(avgpool_->forward(h));                               // [N, classes]
}

namespace {

std::shared_ptr<Module> build(ConvNeXtConfig c, const ModelOptions& o) {
  if (o.dropout > 0.0)
    throw std::invalid_argument("model '" + o.name +
                                "' has no dropout (torchvision's ConvNeXt has none); use drop_path");
  if (o.stem != "imagenet")
    throw std::invalid_argument("model '" + o.name + "': stem '" + o.stem +
                                "' is a ResNet option; ConvNeXt's stem is set by stem_patch");
  if (o.stem_patch > 0) c.stem_patch = o.stem_patch;
  if (o.drop_path) c.stochastic_depth_prob = *o.drop_path;
  c.layer_scale = o.layer_scale;
  c.in_channels = o.in_channels;
  c.num_classes = o.num_classes;
  Generator gen(o.seed);
  return std::make_shared<ConvNeXt>(c, dropout_generator_for(o), gen);
}

}  // namespace

std::shared_ptr<Module> make_convnext_tiny(const ModelOptions& o) {
  ConvNeXtConfig c = ConvNeXtConfig::tiny();
  if ((!o.depths.empty() && o.depths != c.depths) || (!o.widths.empty() && o.widths != c.widths))
    throw std::invalid_argument(
        "model 'convnext_tiny' has depths 3, 3, 9, 3 and widths 96, 192, 384, 768; "
        "for other sizes use model 'convnext'");
  return build(c, o);
}

std::shared_ptr<Module> make_convnext(const ModelOptions& o) {
  ConvNeXtConfig c = ConvNeXtConfig::small_images();
  if (!o.depths.empty()) c.depths = o.depths;
  if (!o.widths.empty()) c.widths = o.widths;
  return build(c, o);
}

}  // namespace trainer
