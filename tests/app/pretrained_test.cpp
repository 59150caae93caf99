// model.pretrained: torchvision-named weights of another class count start a fine-tuning run. Everything
// but the classifier is copied, the classifier keeps its fresh initialisation, and weights of another
// architecture are refused without touching the model.
#include "app/run/pretrained.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "nn/models/registry.h"
#include "nn/safetensors.h"

namespace trainer {
namespace {

std::shared_ptr<Module> resnet18(int64_t classes, uint64_t seed) {
  ModelOptions o;
  o.name = "resnet18";
  o.stem = "imagenet";
  o.num_classes = classes;
  o.image_size = 64;
  o.seed = seed;
  return create_model(o);
}

std::vector<float> values(Module& m, const std::string& name) {
  for (const NamedTensor& nt : m.state_dict())
    if (nt.name == name) return nt.tensor->to_vector<float>();
  ADD_FAILURE() << "no tensor " << name;
  return {};
}

TEST(Pretrained, ImageNetWeightsStartATenClassRunWithAFreshClassifier) {
  const std::string path = ::testing::TempDir() + "/resnet18_1000.safetensors";
  auto imagenet = resnet18(1000, 7);
  save_module(path, *imagenet);
  auto run = resnet18(10, 1);
  const std::vector<float> fresh_fc = values(*run, "fc.weight");
  const PretrainedLoad load = load_pretrained(path, *run, classifier_prefix("resnet18"));
  EXPECT_EQ(load.kept_fresh.size(), 2u);  // fc.weight, fc.bias
  EXPECT_EQ(load.copied, static_cast<int64_t>(run->state_dict().size()) - 2);
  EXPECT_EQ(values(*run, "conv1.weight"), values(*imagenet, "conv1.weight"));
  EXPECT_EQ(values(*run, "layer4.1.bn2.running_var"), values(*imagenet, "layer4.1.bn2.running_var"));
  EXPECT_EQ(values(*run, "fc.weight"), fresh_fc);
  EXPECT_NE(load.summary(path).find("classifier re-initialised"), std::string::npos) << load.summary(path);
}

TEST(Pretrained, WeightsOfAnotherArchitectureAreRefusedAndTheModelIsUntouched) {
  const std::string path = ::testing::TempDir() + "/resnet18_other.safetensors";
  save_module(path, *resnet18(10, 7));
  ModelOptions o;
  o.name = "resnet34";
  o.stem = "imagenet";
  o.image_size = 64;
  auto deeper = create_model(o);
  const std::vector<float> before = values(*deeper, "conv1.weight");
  try {
    load_pretrained(path, *deeper, classifier_prefix("resnet34"));
    ADD_FAILURE() << "resnet18 weights loaded into resnet34";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("missing from the file"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("HINT"), std::string::npos) << e.what();
  }
  EXPECT_EQ(values(*deeper, "conv1.weight"), before);
}

// A ViT trained at 32x32 starts a 16x16 run: its position embedding is resized, the head kept fresh.
TEST(Pretrained, AViTOfAnotherImageSizeAndClassCount) {
  const std::string path = ::testing::TempDir() + "/vit_32_100.safetensors";
  ModelOptions o;
  o.name = "vit";
  o.image_size = 32;
  o.num_classes = 100;
  save_module(path, *create_model(o));
  o.image_size = 16;
  o.num_classes = 10;
  auto run = create_model(o);
  const PretrainedLoad load = load_pretrained(path, *run, classifier_prefix("vit"));
  EXPECT_EQ(load.kept_fresh.size(), 2u);
  ASSERT_EQ(load.resized.size(), 1u);
  EXPECT_EQ(load.resized[0], "encoder.pos_embedding [1, 65, 64] -> [1, 17, 64]");
}

}  // namespace
}  // namespace trainer
