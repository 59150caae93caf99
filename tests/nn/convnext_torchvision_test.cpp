// Our convnext_tiny on torchvision's weights gives torchvision's logits. The reference files come from
// scripts/torchvision_convnext_reference.py (a machine with torch); TRAINER_CONVNEXT_REFERENCE names
// their folder, and without it the test is skipped (scripts/torchvision_model_check.sh convnext_tiny runs
// both).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "nn/models/registry.h"
#include "nn/safetensors.h"

namespace trainer {
namespace {

// max |ours - theirs| / max |theirs|
double relative_difference(const Tensor& ours, const Tensor& theirs) {
  const std::vector<double> a = ours.to_vector<double>(), b = theirs.to_vector<double>();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / std::max(scale, 1e-30);
}

TEST(ConvNeXtTorchvision, LogitsEqualTorchvisionsOnItsWeights) {
  const char* dir = std::getenv("TRAINER_CONVNEXT_REFERENCE");
  if (!dir)
    GTEST_SKIP()
        << "TRAINER_CONVNEXT_REFERENCE not set (scripts/torchvision_model_check.sh convnext_tiny sets it)";
  ModelOptions o;
  o.name = "convnext_tiny";
  o.num_classes = 1000;
  auto model = create_model(o);
  load_module(std::string(dir) + "/convnext_tiny.safetensors", *model);  // strict: names and shapes
  model->eval();
  const std::map<std::string, Tensor> ref =
      load_safetensors(std::string(dir) + "/convnext_tiny_logits.safetensors");
  const Tensor& images = ref.at("images");  // f32 [N, 3, 64, 64]
  const Tensor& logits = ref.at("logits");  // f64 [N, 1000], torchvision in float64

  const Tensor f32 = model->forward(Variable(images)).data();
  EXPECT_EQ(f32.shape(), logits.shape());
  EXPECT_LT(relative_difference(f32, logits), 1e-4) << "float32";  // ours against ours: 6e-7
  model->to(DType::f64);  // the same weights, widened: equal to torchvision up to float64 rounding
  const Tensor f64 = model->forward(Variable(images.to(DType::f64))).data();
  EXPECT_LT(relative_difference(f64, logits), 1e-10) << "float64";
  std::printf("max |ours - torchvision| / max |torchvision|: float32 %.2e, float64 %.2e\n",
              relative_difference(f32, logits), relative_difference(f64, logits));
}

}  // namespace
}  // namespace trainer
