// ConvNeXt: torchvision's names, sizes and initialisation, output shapes, the channels-last layout it
// runs in, stochastic depth per block, and its gradient against finite differences in f64.
#include "nn/models/convnext.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "nn/functional.h"
#include "nn/models/registry.h"
#include "nn/modules/stochastic_depth.h"
#include "state_dict_lookup.h"

namespace trainer {
namespace {

using testing::find;
using testing::keys_of;

using testing::random_tensor;

std::shared_ptr<Module> convnext(const std::string& name, int64_t classes = 1000,
                                 std::vector<int64_t> depths = {}, std::vector<int64_t> widths = {}) {
  ModelOptions o;
  o.name = name;
  o.num_classes = classes;
  o.depths = std::move(depths);
  o.widths = std::move(widths);
  return create_model(o);
}

// The configurable "convnext" at these depths and widths, the rest its defaults.
ModelOptions small_convnext(std::vector<int64_t> depths, std::vector<int64_t> widths) {
  ModelOptions o;
  o.name = "convnext";
  o.depths = std::move(depths);
  o.widths = std::move(widths);
  return o;
}

std::vector<CNBlock*> blocks_of(Module& m) {
  std::vector<CNBlock*> out;
  for (auto& [name, child] : m.named_modules())
    if (auto* b = dynamic_cast<CNBlock*>(child)) out.push_back(b);
  return out;
}

TEST(ConvNeXt, TinyHasTorchvisionsParameterCountAndKeys) {
  auto m = convnext("convnext_tiny");
  EXPECT_EQ(m->parameter_count(), 28'589'128);  // torchvision.models.convnext_tiny()
  const std::vector<std::string> keys = keys_of(*m);
  // stem 4 + 18 blocks * 9 + 3 downsamplings * 4 + classifier 4; no buffers.
  ASSERT_EQ(keys.size(), 182u);
  const std::vector<std::string> first = {
      "features.0.0.weight",         "features.0.0.bias",           "features.0.1.weight",
      "features.0.1.bias",           "features.1.0.layer_scale",    "features.1.0.block.0.weight",
      "features.1.0.block.0.bias",   "features.1.0.block.2.weight", "features.1.0.block.2.bias",
      "features.1.0.block.3.weight", "features.1.0.block.3.bias",   "features.1.0.block.5.weight",
      "features.1.0.block.5.bias",   "features.1.1.layer_scale"};
  EXPECT_EQ(std::vector<std::string>(keys.begin(), keys.begin() + first.size()), first);
  const std::vector<std::string> last = {"features.7.2.block.5.bias", "classifier.0.weight",
                                         "classifier.0.bias", "classifier.2.weight", "classifier.2.bias"};
  EXPECT_EQ(std::vector<std::string>(keys.end() - last.size(), keys.end()), last);
  EXPECT_EQ(find(*m, "features.0.0.weight").shape(), (Shape{96, 3, 4, 4}));
  EXPECT_EQ(find(*m, "features.1.0.layer_scale").shape(), (Shape{96, 1, 1}));
  EXPECT_EQ(find(*m, "features.1.0.block.0.weight").shape(), (Shape{96, 1, 7, 7}));
  EXPECT_EQ(find(*m, "features.1.0.block.3.weight").shape(), (Shape{384, 96}));
  EXPECT_EQ(find(*m, "features.1.0.block.5.weight").shape(), (Shape{96, 384}));
  EXPECT_EQ(find(*m, "features.2.0.weight").shape(), (Shape{96}));
  EXPECT_EQ(find(*m, "features.2.1.weight").shape(), (Shape{192, 96, 2, 2}));
  EXPECT_EQ(find(*m, "features.5.8.layer_scale").shape(), (Shape{384, 1, 1}));
  EXPECT_EQ(find(*m, "features.6.1.bias").shape(), (Shape{768}));
  EXPECT_EQ(find(*m, "classifier.2.weight").shape(), (Shape{1000, 768}));
}

TEST(ConvNeXt, InitialisationFollowsTorchvision) {
  auto m = convnext("convnext_tiny");
  // Conv2d and Linear weights: trunc_normal(std 0.02); their biases 0.
  for (const std::string key :
       {"features.5.3.block.3.weight", "features.2.1.weight", "classifier.2.weight"}) {
    const std::vector<float> w = find(*m, key).to_vector<float>();
    double sum = 0, sq = 0;
    for (float v : w) sum += v, sq += static_cast<double>(v) * v;
    EXPECT_NEAR(sum / w.size(), 0.0, 1e-3) << key;
    EXPECT_NEAR(std::sqrt(sq / w.size()), 0.02, 1e-3) << key;
  }
  for (const std::string key : {"features.0.0.bias", "features.1.0.block.0.bias", "features.7.2.block.5.bias",
                                "features.1.0.block.2.bias", "classifier.2.bias"})
    for (float v : find(*m, key).to_vector<float>()) ASSERT_EQ(v, 0.0f) << key;
  for (float v : find(*m, "features.1.0.block.2.weight").to_vector<float>()) ASSERT_EQ(v, 1.0f);
  for (float v : find(*m, "features.7.2.layer_scale").to_vector<float>()) ASSERT_FLOAT_EQ(v, 1e-6f);
}

TEST(ConvNeXt, DropPathRisesLinearlyToTheLastBlock) {
  auto m = convnext("convnext_tiny");
  const std::vector<CNBlock*> blocks = blocks_of(*m);
  ASSERT_EQ(blocks.size(), 18u);
  for (size_t b = 0; b < blocks.size(); ++b) EXPECT_DOUBLE_EQ(blocks[b]->drop_path(), 0.1 * b / 17.0) << b;

  ModelOptions o;
  o.name = "convnext";
  o.drop_path = 0.3;
  auto small = create_model(o);
  const std::vector<CNBlock*> small_blocks = blocks_of(*small);
  ASSERT_EQ(small_blocks.size(), 12u);  // depths 2, 2, 6, 2
  EXPECT_DOUBLE_EQ(small_blocks.front()->drop_path(), 0.0);
  EXPECT_DOUBLE_EQ(small_blocks.back()->drop_path(), 0.3);
}

TEST(ConvNeXt, OutputShapesForSmallAndImagenetSizedModels) {
  auto tiny = convnext("convnext_tiny");
  tiny->eval();
  Generator gen(51);
  EXPECT_EQ(tiny->forward(Variable(random_tensor({1, 3, 32, 32}, gen).to(DType::f32))).shape(),
            (Shape{1, 1000}));

  auto small = convnext("convnext", 10);
  EXPECT_EQ(small->forward(Variable(random_tensor({2, 3, 32, 32}, gen).to(DType::f32))).shape(),
            (Shape{2, 10}));
  // 28x28 grey images: 14, 7, 3, 1 pixels a side per stage.
  ModelOptions o = small_convnext({1, 1, 1, 1}, {8, 16, 24, 32});
  o.in_channels = 1;
  EXPECT_EQ(create_model(o)->forward(Variable(random_tensor({2, 1, 28, 28}, gen).to(DType::f32))).shape(),
            (Shape{2, 10}));
}

TEST(ConvNeXt, BlocksKeepAChannelsLastMapChannelsLast) {
  Generator gen(52);
  CNBlock block(8, 0.5, 0.0, nullptr, gen);
  const Tensor x = random_tensor({2, 8, 5, 6}, gen).to(DType::f32);
  const Variable y_cl = block.forward(Variable(x.contiguous(MemoryFormat::channels_last)));
  EXPECT_EQ(y_cl.data().suggest_memory_format(), MemoryFormat::channels_last);
  EXPECT_TRUE(y_cl.data().is_contiguous(MemoryFormat::channels_last));
  // An NCHW input takes the copying path to the same values.
  const Variable y_nchw = block.forward(Variable(x));
  const std::vector<float> a = y_cl.data().to_vector<float>(), b = y_nchw.data().to_vector<float>();
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-5) << i;
}

TEST(ConvNeXt, BlockMatchesItsDefinition) {
  // x + layer_scale * Linear2(GELU(Linear1(LayerNorm(dwconv(x)))) over channels, built from the ops.
  Generator gen(53);
  CNBlock block(4, 0.7, 0.0, nullptr, gen);
  block.to(DType::f64);
  const Variable x(random_tensor({2, 4, 3, 3}, gen));
  std::vector<Variable> p;
  for (const auto& np : block.named_parameters()) p.push_back(np.param);
  // named_parameters: layer_scale, block.0.{weight,bias}, block.2.{weight,bias}, block.3..., block.5...
  Conv2dParams dw;
  dw.pad_h = dw.pad_w = 3;
  dw.groups = 4;
  Variable h = F::permute(F::conv2d(x, p[1], p[2], dw), {0, 2, 3, 1});
  h = F::linear(F::gelu(F::linear(F::layer_norm(F::contiguous(h), 4, p[3], p[4], 1e-6), p[5], p[6])), p[7],
                p[8]);
  const Variable expected = F::add(x, F::mul(F::permute(h, {0, 3, 1, 2}), p[0]));
  const std::vector<double> a = block.forward(x).data().to_vector<double>(),
                            b = expected.data().to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-12) << i;
}

// The block's end is one op (F::scaled_residual_add); in training it must draw drop path's masks as
// F::drop_path does and give the composed definition's values and gradients.
TEST(ConvNeXt, BlockWithDropPathMatchesItsDefinitionWithTheSameDraws) {
  Generator gen(59);
  CNBlock block(4, 0.7, 0.5, std::make_shared<Generator>(77), gen);
  block.to(DType::f64);
  const Tensor x0 = random_tensor({6, 4, 3, 3}, gen);
  Variable xa(x0.clone(), true);
  Variable ya = block.forward(xa);
  F::sum(ya).backward();

  std::vector<Variable> p;
  for (const auto& np : block.named_parameters()) p.push_back(Variable(np.param.data().clone(), true));
  Conv2dParams dw;
  dw.pad_h = dw.pad_w = 3;
  dw.groups = 4;
  Variable xb(x0.clone(), true);
  Variable h = F::permute(F::conv2d(xb, p[1], p[2], dw), {0, 2, 3, 1});
  h = F::linear(F::gelu(F::linear(F::layer_norm(F::contiguous(h), 4, p[3], p[4], 1e-6), p[5], p[6])), p[7],
                p[8]);
  Generator masks(77);
  const Variable branch = F::drop_path(F::mul(h, F::reshape(p[0], {4})), 0.5, true, masks);
  const Variable yb = F::permute(F::add(F::permute(xb, {0, 2, 3, 1}), branch), {0, 3, 1, 2});
  F::sum(yb).backward();

  const std::vector<double> a = ya.data().contiguous().to_vector<double>(),
                            b = yb.data().contiguous().to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-12) << i;
  const std::vector<double> ga = xa.grad().contiguous().to_vector<double>(),
                            gb = xb.grad().contiguous().to_vector<double>();
  for (size_t i = 0; i < ga.size(); ++i) ASSERT_NEAR(ga[i], gb[i], 1e-12) << i;
  const std::vector<double> sa = block.layer_scale().grad().to_vector<double>(),
                            sb = p[0].grad().to_vector<double>();
  for (size_t i = 0; i < sa.size(); ++i) ASSERT_NEAR(sa[i], sb[i], 1e-12) << i;
}

TEST(ConvNeXt, LayerScaleIsCastToTheActivationsDtype) {
  // Autocast's case, half activations and an f32 layer_scale, with f64 standing in for the half dtype
  // (the CPU backend has no half kernels).
  Generator gen(57);
  CNBlock block(4, 0.5, 0.0, nullptr, gen);
  block.to(DType::f64);
  block.layer_scale().data() = block.layer_scale().data().to(DType::f32);
  const Variable y = block.forward(Variable(random_tensor({2, 4, 3, 3}, gen)));
  EXPECT_EQ(y.dtype(), DType::f64);
  F::sum(y).backward();
  ASSERT_TRUE(block.layer_scale().grad().defined());
  EXPECT_EQ(block.layer_scale().grad().dtype(), DType::f32);
  EXPECT_EQ(block.layer_scale().grad().shape(), (Shape{4, 1, 1}));
}

TEST(ConvNeXt, TrainingDropsBlocksEvalIsDeterministic) {
  ModelOptions o = small_convnext({2, 2}, {8, 16});
  o.drop_path = 0.5;
  o.layer_scale = 1.0;  // blocks that change the output visibly
  auto m = create_model(o);
  Generator gen(54);
  const Variable x(random_tensor({4, 3, 16, 16}, gen).to(DType::f32));
  m->eval();
  const std::vector<float> e1 = m->forward(x).data().to_vector<float>(),
                           e2 = m->forward(x).data().to_vector<float>();
  EXPECT_EQ(e1, e2);
  m->train();
  bool differs = false;
  for (int i = 0; i < 4 && !differs; ++i) differs = m->forward(x).data().to_vector<float>() != e1;
  EXPECT_TRUE(differs);
}

// The trainer stages each step's drop-path masks before the forward (a CUDA graph cannot draw on the
// host): staged masks are the draws the forward would make, in the same order, so a run gives the same
// numbers staged or not; each staged mask is read once, and a forward with nothing staged (or another
// batch size) draws as before.
TEST(ConvNeXt, StagedDropPathMasksAreTheDrawsTheForwardWouldMake) {
  ModelOptions o = small_convnext({2, 2}, {8, 16});
  o.drop_path = 0.5;
  o.layer_scale = 1.0;
  o.seed = 7;
  auto model_with = [&o] {
    ModelOptions with_gen = o;
    with_gen.dropout_generator = std::make_shared<Generator>(99);
    return create_model(with_gen);
  };
  auto drawn = model_with(), staged = model_with();
  DropPathStager stager(*staged, 4);
  ASSERT_FALSE(stager.empty());
  // The buffer is sized once (a captured graph reads its address): a larger batch throws before drawing.
  EXPECT_THROW(stager.stage(5, Device::cpu()), std::invalid_argument);
  Generator gen(57);
  const Tensor x4 = random_tensor({4, 3, 16, 16}, gen).to(DType::f32);
  const Tensor x3 = random_tensor({3, 3, 16, 16}, gen).to(DType::f32);
  for (int step = 0; step < 3; ++step) {
    stager.stage(4, Device::cpu());
    EXPECT_EQ(staged->forward(Variable(x4)).data().to_vector<float>(),
              drawn->forward(Variable(x4)).data().to_vector<float>())
        << step;
  }
  // Consumed: the next forward draws from the generator, as the unstaged model's does.
  EXPECT_EQ(staged->forward(Variable(x4)).data().to_vector<float>(),
            drawn->forward(Variable(x4)).data().to_vector<float>());
  // An epoch's smaller last batch is staged at its own size, in the same buffer.
  stager.stage(3, Device::cpu());
  EXPECT_EQ(staged->forward(Variable(x3)).data().to_vector<float>(),
            drawn->forward(Variable(x3)).data().to_vector<float>());
  staged->eval();
  stager.stage(4, Device::cpu());  // nothing staged in evaluation
  drawn->eval();
  EXPECT_EQ(staged->forward(Variable(x4)).data().to_vector<float>(),
            drawn->forward(Variable(x4)).data().to_vector<float>());
  // Nor drawn: back in training, both generators are where they were.
  staged->train();
  drawn->train();
  EXPECT_EQ(staged->forward(Variable(x4)).data().to_vector<float>(),
            drawn->forward(Variable(x4)).data().to_vector<float>());
  EXPECT_FALSE(DropPathStager(*convnext("convnext_tiny"), 8).empty());
  ModelOptions no_drop = o;
  no_drop.drop_path = 0.0;
  EXPECT_TRUE(DropPathStager(*create_model(no_drop), 8).empty());
}

TEST(ConvNeXt, F32ChannelsLastPathMatchesF64) {
  // f32 runs oneDNN's channels-last convolutions (when built with it), f64 the im2col path in NCHW.
  ModelOptions o = small_convnext({1, 2}, {8, 16});
  o.layer_scale = 0.5;
  o.seed = 5;
  auto f32 = create_model(o), f64 = create_model(o);
  f32->eval();
  f64->eval();
  f64->to(DType::f64);
  Generator gen(55);
  const Tensor x = random_tensor({2, 3, 12, 12}, gen);
  const std::vector<double> a = f32->forward(Variable(x.to(DType::f32))).data().to_vector<double>(),
                            b = f64->forward(Variable(x)).data().to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-4 * (1 + std::abs(b[i]))) << i;
}

TEST(ConvNeXt, LossGradientMatchesFiniteDifferencesInF64) {
  ModelOptions o = small_convnext({1, 1}, {4, 8});
  o.num_classes = 3;
  o.drop_path = 0.0;
  o.seed = 9;
  auto m = create_model(o);
  m->to(DType::f64);
  Generator gen(56);
  // Parameters off the initial point, with activations and gradients of order 1 (at torchvision's std
  // 0.02 most gradients are too small for the comparison to mean much): weights of variance 1/fan_in,
  // layer scales in [0.3, 0.8], LayerNorm weights near 1, biases near 0.
  for (const auto& np : m->named_parameters()) {
    Tensor t = np.param.data();
    const bool is_weight = np.name.size() > 7 && np.name.compare(np.name.size() - 7, 7, ".weight") == 0;
    if (np.name.find("layer_scale") != std::string::npos) {
      uniform_(t, 0.3, 0.8, gen);
    } else if (t.dim() >= 2) {
      const double bound = std::sqrt(3.0 / static_cast<double>(init::fan_in_and_fan_out(t).first));
      uniform_(t, -bound, bound, gen);
    } else {
      uniform_(t, is_weight ? 0.7 : -0.3, is_weight ? 1.3 : 0.3, gen);
    }
  }
  Variable x(random_tensor({2, 3, 8, 8}, gen), true);
  const Tensor targets = Tensor::from_vector<int64_t>({0, 2}, {2});
  auto loss = [&] { return F::cross_entropy(m->forward(x), targets); };

  m->zero_grad();
  x.zero_grad();
  loss().backward();
  std::vector<std::pair<std::string, Variable>> checked{{"input", x}};
  for (const auto& np : m->named_parameters()) checked.emplace_back(np.name, np.param);
  int count = 0;
  for (auto& [name, v] : checked) {
    const Tensor grad = v.grad();
    ASSERT_TRUE(grad.defined()) << name;
    const std::vector<double> analytic = grad.to_vector<double>();
    double* data = v.data().data<double>();
    for (int k = 0; k < 3; ++k) {  // a few entries of every parameter and of the input
      const int64_t i = static_cast<int64_t>(gen.uniform() * v.numel()) % v.numel();
      const double saved = data[i], h = 1e-5;
      double lp, lm;
      {
        NoGradGuard ng;
        data[i] = saved + h;
        lp = loss().data().item();
        data[i] = saved - h;
        lm = loss().data().item();
        data[i] = saved;
      }
      const double numeric = (lp - lm) / (2 * h);
      EXPECT_NEAR(analytic[i], numeric, 1e-9 + 1e-6 * std::abs(numeric)) << name << "[" << i << "]";
      ++count;
    }
  }
  EXPECT_EQ(count, 3 * (1 + 4 + 9 * 2 + 4 + 4));  // input, stem, 2 blocks, 1 downsampling, classifier
}

TEST(ConvNeXt, RegistryRefusesBadOptions) {
  EXPECT_THROW(convnext("convnext_tiny", 10, {2, 2, 2, 2}), std::invalid_argument);
  EXPECT_NO_THROW(convnext("convnext_tiny", 10, {3, 3, 9, 3}, {96, 192, 384, 768}));
  EXPECT_THROW(convnext("convnext", 10, {2, 2}, {8, 16, 32}), std::invalid_argument);
  EXPECT_THROW(convnext("convnext", 10, {2, 0}, {8, 16}), std::invalid_argument);
  ModelOptions o;
  o.name = "convnext";
  o.drop_path = 1.0;
  EXPECT_THROW(create_model(o), std::invalid_argument);
  o.drop_path = 0.1;
  o.dropout = 0.2;
  EXPECT_THROW(create_model(o), std::invalid_argument);
  o.dropout = 0.0;
  o.stem = "cifar";
  EXPECT_THROW(create_model(o), std::invalid_argument);
  o.stem = "imagenet";
  o.layer_scale = 0.0;
  EXPECT_THROW(create_model(o), std::invalid_argument);
}

}  // namespace
}  // namespace trainer
