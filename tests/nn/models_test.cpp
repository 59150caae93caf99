#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "nn/functional.h"
#include "nn/models/registry.h"
#include "nn/models/resnet.h"
#include "state_dict_lookup.h"

namespace trainer {
namespace {

using testing::find;
using testing::keys_of;

std::shared_ptr<Module> model(const std::string& name, const std::string& stem = "imagenet",
                              int64_t classes = 1000, int64_t channels = 3, uint64_t seed = 0,
                              int64_t image_size = 32) {
  ModelOptions o;
  o.name = name;
  o.stem = stem;
  o.num_classes = classes;
  o.in_channels = channels;
  o.seed = seed;
  o.image_size = image_size;
  return create_model(o);
}

TEST(ModelRegistry, ParameterCountsEqualTorchvision) {
  EXPECT_EQ(model("resnet18")->parameter_count(), 11'689'512);
  EXPECT_EQ(model("resnet34")->parameter_count(), 21'797'672);
  EXPECT_EQ(model("resnet50")->parameter_count(), 25'557'032);
}

TEST(ModelRegistry, ResNet18KeysEqualTorchvision) {
  auto m = model("resnet18");
  const std::vector<std::string> keys = keys_of(*m);
  ASSERT_EQ(keys.size(), 122u);
  const std::vector<std::string> first = {"conv1.weight",
                                          "bn1.weight",
                                          "bn1.bias",
                                          "bn1.running_mean",
                                          "bn1.running_var",
                                          "bn1.num_batches_tracked",
                                          "layer1.0.conv1.weight",
                                          "layer1.0.bn1.weight",
                                          "layer1.0.bn1.bias",
                                          "layer1.0.bn1.running_mean",
                                          "layer1.0.bn1.running_var",
                                          "layer1.0.bn1.num_batches_tracked",
                                          "layer1.0.conv2.weight"};
  EXPECT_EQ(std::vector<std::string>(keys.begin(), keys.begin() + first.size()), first);
  EXPECT_EQ(keys[keys.size() - 2], "fc.weight");
  EXPECT_EQ(keys.back(), "fc.bias");
  // layer2.0's downsample follows its bn2, as in torchvision's state_dict.
  const auto at = std::find(keys.begin(), keys.end(), "layer2.0.downsample.0.weight");
  ASSERT_NE(at, keys.end());
  EXPECT_EQ(*(at - 1), "layer2.0.bn2.num_batches_tracked");
  EXPECT_EQ(*(at + 1), "layer2.0.downsample.1.weight");
  EXPECT_EQ(*(at + 4), "layer2.0.downsample.1.running_var");
  EXPECT_EQ(*(at + 5), "layer2.0.downsample.1.num_batches_tracked");
  EXPECT_EQ(std::count(keys.begin(), keys.end(), "layer1.0.downsample.0.weight"), 0);
  EXPECT_EQ(find(*m, "layer4.1.conv2.weight").shape(), (Shape{512, 512, 3, 3}));
  EXPECT_EQ(find(*m, "conv1.weight").shape(), (Shape{64, 3, 7, 7}));
  EXPECT_EQ(find(*m, "fc.weight").shape(), (Shape{1000, 512}));
}

TEST(ModelRegistry, ResNet50KeysEqualTorchvision) {
  auto m = model("resnet50");
  const std::vector<std::string> keys = keys_of(*m);
  EXPECT_EQ(keys.size(), 320u);
  EXPECT_NE(std::find(keys.begin(), keys.end(), "layer1.0.downsample.0.weight"), keys.end());
  EXPECT_NE(std::find(keys.begin(), keys.end(), "layer4.2.bn3.running_var"), keys.end());
  EXPECT_EQ(find(*m, "layer1.0.conv3.weight").shape(), (Shape{256, 64, 1, 1}));
  EXPECT_EQ(find(*m, "layer2.0.conv2.weight").shape(), (Shape{128, 128, 3, 3}));  // stride on the 3x3
  EXPECT_EQ(find(*m, "fc.weight").shape(), (Shape{1000, 2048}));
}

TEST(ModelRegistry, AnyChannelsClassesAndTheCifarStem) {
  auto m = model("resnet18", "cifar", 10, 1);
  EXPECT_EQ(find(*m, "conv1.weight").shape(), (Shape{64, 1, 3, 3}));
  EXPECT_EQ(find(*m, "fc.bias").shape(), (Shape{10}));
  EXPECT_EQ(keys_of(*m).size(), 122u);
  EXPECT_EQ(m->parameter_count(), 11'689'512 - 64 * 3 * 49 + 64 * 1 * 9 - 990 * 513);
}

TEST(ModelRegistry, SmallModelsHaveTheReferenceShapes) {
  auto mlp = model("mlp", "imagenet", 10, 1, 0, 28);
  EXPECT_EQ(keys_of(*mlp), (std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
                                                     "fc3.weight", "fc3.bias"}));
  EXPECT_EQ(mlp->parameter_count(), 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
  auto cnn = model("cnn", "imagenet", 10, 1, 0, 28);
  EXPECT_EQ(cnn->parameter_count(), 320 + 64 + 18'496 + 128 + 401'536 + 1'290);
  EXPECT_EQ(find(*cnn, "fc1.weight").shape(), (Shape{128, 64 * 7 * 7}));
  EXPECT_EQ(keys_of(*cnn).size(), 4u + 5 + 5 + 4);
}

TEST(ModelRegistry, UnknownNamesAndBadOptionsAreRefused) {
  try {
    model("resnet101");
    FAIL() << "expected an exception";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("resnet101"), std::string::npos) << what;
    for (const char* known : {"mlp", "cnn", "resnet18", "resnet34", "resnet50", "vit_b_16", "vit_s_16", "vit",
                              "convnext_tiny", "convnext"})
      EXPECT_NE(what.find(known), std::string::npos) << what;
  }
  EXPECT_THROW(model("resnet18", "tiny"), std::invalid_argument);
  EXPECT_THROW(model("resnet18", "imagenet", 0), std::invalid_argument);
  ModelOptions o;
  o.name = "resnet18";
  o.dropout = 0.2;
  EXPECT_THROW(create_model(o), std::invalid_argument);
  EXPECT_EQ(model_names().size(), 10u);
}

TEST(ModelInit, DeterministicForASeed) {
  auto a = model("resnet18", "cifar", 10, 3, 5);
  auto b = model("resnet18", "cifar", 10, 3, 5);
  auto c = model("resnet18", "cifar", 10, 3, 6);
  for (const char* key : {"conv1.weight", "layer3.1.conv2.weight", "fc.weight", "fc.bias"}) {
    EXPECT_EQ(find(*a, key).to_vector<float>(), find(*b, key).to_vector<float>()) << key;
    EXPECT_NE(find(*a, key).to_vector<float>(), find(*c, key).to_vector<float>()) << key;
  }
}

TEST(ModelInit, ResNetFollowsTorchvision) {
  auto m = model("resnet18");
  // Conv weights: kaiming_normal(fan_out, relu): std = sqrt(2 / (out * k * k)).
  for (const char* key : {"layer4.1.conv2.weight", "layer3.0.conv1.weight", "conv1.weight"}) {
    const Tensor w = find(*m, key);
    const std::vector<double> v = w.to_vector<double>();
    double s = 0;
    for (double x : v) s += x * x;
    const double expected = std::sqrt(2.0 / (w.size(0) * w.size(2) * w.size(3)));
    EXPECT_NEAR(std::sqrt(s / v.size()), expected, 0.05 * expected) << key;
  }
  EXPECT_EQ(find(*m, "layer2.0.bn2.weight").to_vector<float>(), std::vector<float>(128, 1.0f));
  EXPECT_EQ(find(*m, "layer2.0.downsample.1.bias").to_vector<float>(), std::vector<float>(128, 0.0f));
  // fc keeps Linear's default: uniform within 1/sqrt(512).
  const std::vector<float> fc = find(*m, "fc.weight").to_vector<float>();
  const float bound = 1.0f / std::sqrt(512.0f);
  EXPECT_LE(*std::max_element(fc.begin(), fc.end()), bound);
  EXPECT_GE(*std::min_element(fc.begin(), fc.end()), -bound);
  EXPECT_GT(*std::max_element(fc.begin(), fc.end()), 0.99f * bound);
}

TEST(ModelInit, ZeroInitResidualZeroesTheLastBnOfEachBlock) {
  ModelOptions o;
  o.name = "resnet18";
  o.zero_init_residual = true;
  auto basic = create_model(o);
  EXPECT_EQ(find(*basic, "layer1.0.bn2.weight").to_vector<float>(), std::vector<float>(64, 0.0f));
  EXPECT_EQ(find(*basic, "layer1.0.bn1.weight").to_vector<float>(), std::vector<float>(64, 1.0f));
  o.name = "resnet50";
  auto bottleneck = create_model(o);
  EXPECT_EQ(find(*bottleneck, "layer4.2.bn3.weight").to_vector<float>(), std::vector<float>(2048, 0.0f));
  EXPECT_EQ(find(*bottleneck, "layer4.2.bn2.weight").to_vector<float>(), std::vector<float>(512, 1.0f));
}

// Forward + backward through a model; skips while a colleague's kernel is still a placeholder.
void check_forward_backward(Module& m, const Shape& input_shape, int64_t classes) {
  Generator gen(11);
  Tensor x = Tensor::empty(input_shape);
  uniform_(x, -1.0, 1.0, gen);
  Tensor r = Tensor::empty({input_shape[0], classes});
  uniform_(r, -1.0, 1.0, gen);
  Variable y;
  try {
    y = m(Variable(x));
    F::sum(F::mul(y, Variable(r))).backward();
  } catch (const std::logic_error& e) {
    if (std::string(e.what()).find("not yet implemented") != std::string::npos)
      GTEST_SKIP() << "kernel pending: " << e.what();
    throw;
  }
  EXPECT_EQ(y.shape(), (Shape{input_shape[0], classes}));
  for (const auto& np : m.named_parameters()) {
    ASSERT_TRUE(np.param.grad().defined()) << np.name;
    EXPECT_EQ(np.param.grad().shape(), np.param.shape()) << np.name;
    const std::vector<double> g = np.param.grad().to_vector<double>();
    EXPECT_TRUE(std::all_of(g.begin(), g.end(), [](double v) { return std::isfinite(v); })) << np.name;
    EXPECT_TRUE(std::any_of(g.begin(), g.end(), [](double v) { return v != 0.0; })) << np.name;
  }
}

TEST(ModelForward, CnnOnFashionMnistShapes) {
  auto m = model("cnn", "imagenet", 10, 1, 0, 28);
  check_forward_backward(*m, {2, 1, 28, 28}, 10);
  if (HasFatalFailure() || IsSkipped()) return;
  EXPECT_EQ(find(*m, "bn1.num_batches_tracked").item(), 1.0);
  m->eval();
  NoGradGuard no_grad;
  EXPECT_EQ((*m)(Variable(Tensor::zeros({3, 1, 28, 28}))).shape(), (Shape{3, 10}));
}

TEST(ModelForward, CnnWithDropout) {
  ModelOptions o;
  o.name = "cnn";
  o.in_channels = 1;
  o.image_size = 28;
  o.dropout = 0.25;
  auto m = create_model(o);
  const std::vector<std::string> keys = keys_of(*m);
  EXPECT_EQ(keys.size(), 18u);
  check_forward_backward(*m, {2, 1, 28, 28}, 10);
}

TEST(ModelForward, MlpShapes) {
  auto m = model("mlp", "imagenet", 10, 1, 0, 28);
  check_forward_backward(*m, {2, 1, 28, 28}, 10);
  EXPECT_THROW((*m)(Variable(Tensor::zeros({2, 1, 32, 32}))), std::invalid_argument);
}

TEST(ModelForward, ResNet18CifarShapes) {
  auto m = model("resnet18", "cifar", 10, 3, 0);
  check_forward_backward(*m, {2, 3, 32, 32}, 10);
}

TEST(ModelForward, ResNet50ImagenetStemOnSmallImages) {
  auto m = model("resnet50", "imagenet", 7, 2, 0);
  check_forward_backward(*m, {2, 2, 64, 64}, 7);
}

}  // namespace
}  // namespace trainer
