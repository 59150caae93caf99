// The Vision Transformers of the registry (vit_b_16, vit_s_16, the small `vit`): torchvision's names,
// shapes, parameter counts and initialisation; the whole model's gradient against finite differences
// in f64; and the position embedding's resampling for another image size.
#include "nn/models/vit.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "nn/functional.h"
#include "nn/models/registry.h"
#include "nn/models/vit_position_embedding.h"
#include "nn/safetensors.h"
#include "state_dict_lookup.h"

namespace trainer {
namespace {

using testing::find;

ModelOptions vit_options(const std::string& name, int64_t image_size, int64_t classes, int64_t channels = 3) {
  ModelOptions o;
  o.name = name;
  o.image_size = image_size;
  o.num_classes = classes;
  o.in_channels = channels;
  return o;
}

// A ViT's parameters from its sizes: what torchvision's class holds.
int64_t vit_parameters(int64_t channels, int64_t patch, int64_t grid, int64_t layers, int64_t d, int64_t mlp,
                       int64_t classes) {
  const int64_t per_layer =
      2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (d * mlp + mlp) + (mlp * d + d);
  return (channels * patch * patch * d + d) + d + (1 + grid * grid) * d + layers * per_layer + 2 * d +
         (d * classes + classes);
}

TEST(VisionTransformer, ParameterCountsEqualTorchvision) {
  const auto b16 = create_model(vit_options("vit_b_16", 224, 1000));
  EXPECT_EQ(b16->parameter_count(), 86'567'656);  // torchvision.models.vit_b_16()
  EXPECT_EQ(b16->parameter_count(), vit_parameters(3, 16, 14, 12, 768, 3072, 1000));
  const auto s16 = create_model(vit_options("vit_s_16", 224, 1000));
  EXPECT_EQ(s16->parameter_count(), 22'050'664);  // the same class at 6 heads, D 384, MLP 1536
  EXPECT_EQ(s16->parameter_count(), vit_parameters(3, 16, 14, 12, 384, 1536, 1000));
}

TEST(VisionTransformer, KeysAndShapesEqualTorchvision) {
  auto m = create_model(vit_options("vit_s_16", 224, 1000));
  std::vector<std::string> keys;
  for (const auto& nt : m->state_dict()) keys.push_back(nt.name);
  ASSERT_EQ(keys.size(), 4u + 12u * 12u + 4u);
  const std::vector<std::string> head{"class_token", "conv_proj.weight", "conv_proj.bias",
                                      "encoder.pos_embedding"};
  EXPECT_EQ(std::vector<std::string>(keys.begin(), keys.begin() + 4), head);
  const std::string l = "encoder.layers.encoder_layer_0.";
  const std::vector<std::string> layer0{l + "ln_1.weight",
                                        l + "ln_1.bias",
                                        l + "self_attention.in_proj_weight",
                                        l + "self_attention.in_proj_bias",
                                        l + "self_attention.out_proj.weight",
                                        l + "self_attention.out_proj.bias",
                                        l + "ln_2.weight",
                                        l + "ln_2.bias",
                                        l + "mlp.0.weight",
                                        l + "mlp.0.bias",
                                        l + "mlp.3.weight",
                                        l + "mlp.3.bias"};
  EXPECT_EQ(std::vector<std::string>(keys.begin() + 4, keys.begin() + 16), layer0);
  EXPECT_EQ(keys[4 + 11 * 12], "encoder.layers.encoder_layer_11.ln_1.weight");
  const std::vector<std::string> tail{"encoder.ln.weight", "encoder.ln.bias", "heads.head.weight",
                                      "heads.head.bias"};
  EXPECT_EQ(std::vector<std::string>(keys.end() - 4, keys.end()), tail);
  EXPECT_EQ(find(*m, "class_token").shape(), (Shape{1, 1, 384}));
  EXPECT_EQ(find(*m, "conv_proj.weight").shape(), (Shape{384, 3, 16, 16}));
  EXPECT_EQ(find(*m, "encoder.pos_embedding").shape(), (Shape{1, 197, 384}));
  EXPECT_EQ(find(*m, l + "self_attention.in_proj_weight").shape(), (Shape{1152, 384}));
  EXPECT_EQ(find(*m, l + "mlp.0.weight").shape(), (Shape{1536, 384}));
  EXPECT_EQ(find(*m, l + "mlp.3.weight").shape(), (Shape{384, 1536}));
  EXPECT_EQ(find(*m, "heads.head.weight").shape(), (Shape{1000, 384}));
  EXPECT_EQ(m->named_buffers().size(), 0u);
}

double stddev_of(const Tensor& t) {
  const std::vector<double> v = t.to(DType::f64).to_vector<double>();
  double s = 0.0, s2 = 0.0;
  for (double x : v) s += x, s2 += x * x;
  const double n = static_cast<double>(v.size()), mean = s / n;
  return std::sqrt(s2 / n - mean * mean);
}

double largest_magnitude(const Tensor& t) {
  double m = 0.0;
  for (double x : t.to(DType::f64).to_vector<double>()) m = std::max(m, std::abs(x));
  return m;
}

TEST(VisionTransformer, InitialisedAsTorchvision) {
  ModelOptions o = vit_options("vit", 32, 10);
  o.width = 96, o.heads = 3, o.depth = 2, o.mlp_dim = 192, o.patch_size = 8;
  auto m = create_model(o);
  EXPECT_EQ(largest_magnitude(find(*m, "class_token")), 0.0);
  EXPECT_EQ(largest_magnitude(find(*m, "heads.head.weight")), 0.0);
  EXPECT_EQ(largest_magnitude(find(*m, "heads.head.bias")), 0.0);
  EXPECT_EQ(largest_magnitude(find(*m, "conv_proj.bias")), 0.0);
  EXPECT_NEAR(stddev_of(find(*m, "conv_proj.weight")), std::sqrt(1.0 / (3 * 8 * 8)),
              0.03 / std::sqrt(3.0 * 64));
  EXPECT_NEAR(stddev_of(find(*m, "encoder.pos_embedding")), 0.02, 0.002);
  const std::string l = "encoder.layers.encoder_layer_1.";
  EXPECT_LE(largest_magnitude(find(*m, l + "mlp.0.weight")), std::sqrt(6.0 / (96 + 192)));  // xavier_uniform
  EXPECT_GT(largest_magnitude(find(*m, l + "mlp.0.weight")), 0.9 * std::sqrt(6.0 / (96 + 192)));
  EXPECT_LT(largest_magnitude(find(*m, l + "mlp.3.bias")), 1e-5);  // normal(std 1e-6)
  EXPECT_GT(largest_magnitude(find(*m, l + "mlp.3.bias")), 0.0);
  EXPECT_EQ(largest_magnitude(find(*m, l + "self_attention.in_proj_bias")), 0.0);
  EXPECT_EQ(stddev_of(find(*m, l + "ln_2.weight")), 0.0);
  EXPECT_EQ(find(*m, l + "ln_2.weight").to_vector<float>()[0], 1.0f);
  // The same seed gives the same weights.
  auto again = create_model(o);
  EXPECT_EQ(find(*m, "encoder.pos_embedding").to_vector<float>(),
            find(*again, "encoder.pos_embedding").to_vector<float>());
}

TEST(VisionTransformer, ClassifiesFashionMnistShapedBatches) {
  auto m = create_model(vit_options("vit", 28, 10, 1));  // the defaults: patch 4, 6 layers, width 64
  Generator gen(1);
  Tensor x = Tensor::empty({3, 1, 28, 28});
  uniform_(x, 0.0, 1.0, gen);
  const Variable y = m->forward(Variable(x));
  EXPECT_EQ(y.shape(), (Shape{3, 10}));
  EXPECT_EQ(find(*m, "encoder.pos_embedding").shape(), (Shape{1, 50, 64}));
  EXPECT_THROW(m->forward(Variable(Tensor::zeros({3, 1, 32, 32}))), std::invalid_argument);
  auto b16 = create_model(vit_options("vit_b_16", 32, 10));  // 2x2 patches of 16
  EXPECT_EQ(b16->forward(Variable(Tensor::zeros({1, 3, 32, 32}))).shape(), (Shape{1, 10}));
}

TEST(VisionTransformer, RefusesSizesThatDoNotDivide) {
  ModelOptions o = vit_options("vit", 28, 10, 1);
  o.patch_size = 5;
  EXPECT_THROW(create_model(o), std::invalid_argument);
  o.patch_size = 4, o.heads = 3;  // width 64
  EXPECT_THROW(create_model(o), std::invalid_argument);
  EXPECT_THROW(create_model(vit_options("vit_b_16", 28, 10)), std::invalid_argument);
}

TEST(VisionTransformer, DropoutOnlyInTraining) {
  ModelOptions o = vit_options("vit", 8, 4, 1);
  o.patch_size = 4, o.depth = 1, o.width = 8, o.heads = 2, o.mlp_dim = 16, o.dropout = 0.3;
  auto m = create_model(o);
  for (auto& nt : m->state_dict())
    if (nt.name == "heads.head.weight") nt.tensor->fill_(0.5);  // zero-initialised: logits would be the bias
  Tensor x = Tensor::full({2, 1, 8, 8}, 0.25);
  const std::vector<float> a = m->forward(Variable(x)).data().to_vector<float>();
  const std::vector<float> b = m->forward(Variable(x)).data().to_vector<float>();
  EXPECT_NE(a, b);
  m->eval();
  EXPECT_EQ(m->forward(Variable(x)).data().to_vector<float>(),
            m->forward(Variable(x)).data().to_vector<float>());
}

// Every parameter and the input of a tiny ViT against central differences of the loss, in f64.
TEST(VisionTransformer, LossGradientMatchesFiniteDifferences) {
  ModelOptions o = vit_options("vit", 8, 3, 2);
  o.patch_size = 4, o.depth = 2, o.width = 8, o.heads = 2, o.mlp_dim = 16, o.seed = 5;
  auto m = create_model(o);
  m->to(DType::f64);
  Generator gen(6);
  // The zero-initialised head and class token would make most gradients zero: give them values.
  for (auto& nt : m->state_dict())
    if (nt.name == "heads.head.weight" || nt.name == "heads.head.bias" || nt.name == "class_token")
      uniform_(*nt.tensor, -0.5, 0.5, gen);
  std::vector<Variable> inputs{Variable(testing::random_tensor({2, 2, 8, 8}, gen), true)};
  for (const auto& p : m->named_parameters()) inputs.push_back(p.param);
  const Tensor targets = Tensor::from_vector(std::vector<int64_t>{2, 0}, {2});
  const auto r = testing::gradcheck(
      [&](const std::vector<Variable>& in) { return F::cross_entropy(m->forward(in[0]), targets); }, inputs);
  EXPECT_LT(r.max_rel_error, 1e-6) << r.worst;
}

Tensor embedding_of(const std::vector<double>& grid_values, int64_t g, int64_t channels, double token) {
  std::vector<double> v(static_cast<size_t>((1 + g * g) * channels));
  for (int64_t c = 0; c < channels; ++c) v[c] = token + c;
  for (int64_t i = 0; i < g * g; ++i)
    for (int64_t c = 0; c < channels; ++c) v[(1 + i) * channels + c] = grid_values[i] * (c + 1);
  return Tensor::from_vector(v, {1, 1 + g * g, channels});
}

TEST(PositionEmbedding, ConstantStaysConstantAndTheClassTokenIsKept) {
  for (int64_t to : {1, 3, 7, 14, 24}) {
    const Tensor out =
        interpolate_position_embedding(embedding_of(std::vector<double>(49, 0.7), 7, 2, 5.0), to);
    ASSERT_EQ(out.shape(), (Shape{1, 1 + to * to, 2}));
    const std::vector<double> v = out.to_vector<double>();
    EXPECT_EQ(v[0], 5.0);
    EXPECT_EQ(v[1], 6.0);
    for (int64_t i = 0; i < to * to; ++i) {
      EXPECT_NEAR(v[(1 + i) * 2], 0.7, 1e-14) << to << " " << i;
      EXPECT_NEAR(v[(1 + i) * 2 + 1], 1.4, 1e-14) << to << " " << i;
    }
  }
}

// A ramp along x from 4 to 7 samples: align_corners puts every other output on an input sample and
// the rest half-way. Half-way between interior samples a symmetric kernel reproduces the ramp; at the
// two border intervals PyTorch's kernel (A = -0.75) reads the repeated edge sample, which pulls the
// value by A / 8 of a step: 0.5 -> 0.40625 (and 2.5 -> 2.59375).
TEST(PositionEmbedding, LinearRampAsPyTorchsBicubic) {
  std::vector<double> ramp(16);
  for (int64_t y = 0; y < 4; ++y)
    for (int64_t x = 0; x < 4; ++x) ramp[y * 4 + x] = static_cast<double>(x);
  const std::vector<double> v =
      interpolate_position_embedding(embedding_of(ramp, 4, 1, 0.0), 7).to_vector<double>();
  const double expect[7] = {0.0, 0.40625, 1.0, 1.5, 2.0, 2.59375, 3.0};
  for (int64_t y = 0; y < 7; ++y)
    for (int64_t x = 0; x < 7; ++x) EXPECT_NEAR(v[1 + y * 7 + x], expect[x], 1e-14) << y << " " << x;
  // Same grid: unchanged; bad shapes refused.
  const Tensor same = embedding_of(ramp, 4, 1, 0.0);
  EXPECT_EQ(interpolate_position_embedding(same, 4).to_vector<double>(), same.to_vector<double>());
  EXPECT_THROW(interpolate_position_embedding(Tensor::zeros({1, 18, 3}), 3), std::invalid_argument);
  EXPECT_THROW(interpolate_position_embedding(same, 0), std::invalid_argument);
}

// Weights saved at 32x32 (an 8x8 grid of 4-pixel patches) load into the same ViT for 16x16 images:
// the position embedding is resized to the 4x4 grid as interpolate_position_embedding does, the rest is
// copied, and the report names the conversion. Another width is still refused.
TEST(VisionTransformer, LoadsWeightsOfAnotherImageSizeByResizingThePositionEmbedding) {
  const std::string path = ::testing::TempDir() + "/vit_32.safetensors";
  auto at32 = create_model(vit_options("vit", 32, 10));
  save_module(path, *at32);
  auto at16 = create_model(vit_options("vit", 16, 10));
  const ModuleLoadReport report = load_module(path, *at16);
  ASSERT_EQ(report.adapted.size(), 1u);
  EXPECT_EQ(report.adapted[0], "encoder.pos_embedding [1, 65, 64] -> [1, 17, 64]");
  EXPECT_NE(report.note(path).find("resized"), std::string::npos);
  EXPECT_EQ(find(*at16, "encoder.pos_embedding").to_vector<float>(),
            interpolate_position_embedding(find(*at32, "encoder.pos_embedding"), 4).to_vector<float>());
  EXPECT_EQ(find(*at16, "conv_proj.weight").to_vector<float>(),
            find(*at32, "conv_proj.weight").to_vector<float>());

  ModelOptions wider = vit_options("vit", 32, 10);
  wider.width = 32;
  wider.mlp_dim = 64;
  auto other = create_model(wider);
  EXPECT_THROW(load_module(path, *other), std::exception);
}

}  // namespace
}  // namespace trainer
