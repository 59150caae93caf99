// Our vit_b_16 against torchvision's, on the files scripts/make_vit_torchvision_golden.py writes into
// $TRAINER_VIT_GOLDEN_DIR (ctest's torchvision_vit_b_16 does both; skipped without the files): the state
// dict loads strictly, the logits of a fixed batch agree, and interpolate_position_embedding equals
// torchvision's interpolate_embeddings.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "nn/models/registry.h"
#include "nn/models/vit_position_embedding.h"
#include "nn/safetensors.h"

namespace trainer {
namespace {

std::string golden_dir() {
  const char* dir = std::getenv("TRAINER_VIT_GOLDEN_DIR");
  return dir != nullptr && std::filesystem::exists(std::string(dir) + "/vit_b_16.safetensors") ? dir : "";
}

// max |a - b| / max |b|.
double scaled_difference(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to(DType::f64).to_vector<double>(),
                            y = b.to(DType::f64).to_vector<double>();
  double worst = 0.0, scale = 0.0;
  for (size_t i = 0; i < y.size(); ++i)
    worst = std::max(worst, std::abs(x[i] - y[i])), scale = std::max(scale, std::abs(y[i]));
  return worst / scale;
}

TEST(VitTorchvision, LogitsAndInterpolationEqualTorchvisions) {
  const std::string dir = golden_dir();
  if (dir.empty())
    GTEST_SKIP() << "TRAINER_VIT_GOLDEN_DIR unset (scripts/torchvision_model_check.sh vit_b_16 sets it)";
  ModelOptions o;
  o.name = "vit_b_16";
  o.image_size = 224;
  o.num_classes = 1000;
  auto model = create_model(o);
  load_module(dir + "/vit_b_16.safetensors", *model);  // strict: names, shapes, dtypes
  model->eval();
  const auto golden = load_safetensors(dir + "/vit_b_16_logits.safetensors");
  const Tensor logits = model->forward(Variable(golden.at("images"))).data();
  ASSERT_EQ(logits.shape(), golden.at("logits").shape());
  // f32 on both sides, summed in different orders through 12 layers.
  EXPECT_LT(scaled_difference(logits, golden.at("logits")), 1e-4);

  Tensor pos;
  for (const auto& nt : model->state_dict())
    if (nt.name == "encoder.pos_embedding") pos = *nt.tensor;
  const Tensor resized = interpolate_position_embedding(pos, 384 / 16);
  ASSERT_EQ(resized.shape(), golden.at("pos_embedding_384").shape());
  EXPECT_LT(scaled_difference(resized, golden.at("pos_embedding_384")), 1e-5);
}

}  // namespace
}  // namespace trainer
