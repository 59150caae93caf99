// The model card (class names, eval transform) stored with weights and checkpoints, and the pieces of
// `trainer predict` that need no model: path collection, bad files, top-k.
#include "app/run/model_card.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "app/commands/predict/image_files.h"
#include "app/commands/predict/image_inputs.h"
#include "app/commands/predict/prediction_output.h"
#include "app/common/cli.h"
#include "app/run/checkpoint.h"
#include "app/run/model_card_toml.h"
#include "data/image_codec.h"
#include "nn/optim/sgd.h"
#include "nn/random.h"
#include "tiny_mlp.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

ModelCard sample_card() { return {{"cat", "dog", "a \"quoted\", name"}, {5, 4, 1, {0.5f}, {0.25f}}}; }

class ModelCardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("trainer_card_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST(ModelCard, RoundTripsThroughMetadataAndManifest) {
  const ModelCard card = sample_card();
  EXPECT_EQ(model_card_from_metadata(model_card_metadata(card), "f"), card);
  EXPECT_EQ(model_card_from_manifest(toml::table{{"model_card", model_card_toml(card)}}, "m"), card);
  EXPECT_FALSE(model_card_from_metadata({{"crc32c.x", "00000000"}}, "f").has_value());  // an older file
  EXPECT_FALSE(model_card_from_manifest(toml::table{}, "m").has_value());
}

TEST(ModelCard, AMalformedCardIsRefusedNamingTheFile) {
  SafetensorsMetadata m = model_card_metadata(sample_card());
  m.erase("trainer.eval_transform");
  EXPECT_THROW(model_card_from_metadata(m, "w.safetensors"), std::runtime_error);
  m = model_card_metadata(sample_card());
  m["trainer.eval_transform"] = R"({"resize": 2, "crop": 4, "channels": 1, "mean": [0], "std": [1]})";
  try {
    model_card_from_metadata(m, "w.safetensors");
    FAIL() << "a crop larger than the resize was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("w.safetensors: malformed model card"), std::string::npos)
        << e.what();
  }
}

TEST_F(ModelCardTest, WeightsAndCheckpointsCarryTheCard) {
  auto model = testing::tiny_mlp();
  const ModelCard card = sample_card();
  save_weights((dir_ / "final.safetensors").string(), *model, card);
  EXPECT_EQ(read_model_card((dir_ / "final.safetensors").string()), card);
  save_weights((dir_ / "old.safetensors").string(), *model);
  EXPECT_FALSE(read_model_card((dir_ / "old.safetensors").string()).has_value());
  // The CRC-32C check ignores the card's keys.
  EXPECT_NE(load_weights((dir_ / "final.safetensors").string(), *model, CrcCheck::verify).find("matches"),
            std::string::npos);

  Sgd optimizer(model->named_parameters(), SgdOptions{});
  CheckpointManager manager((dir_ / "ckpt").string(), CheckpointConfig{});
  TrainingState state;
  state.step = 3;
  const std::string path = manager.save(*model, optimizer, state, "", card);
  EXPECT_NO_THROW(verify_checkpoint(path));
  EXPECT_EQ(read_model_card(path + "/model.safetensors"), card);
  std::stringstream manifest;
  manifest << std::ifstream(path + "/checkpoint.toml").rdbuf();
  EXPECT_NE(manifest.str().find("[model_card]"), std::string::npos) << manifest.str();
}

TEST_F(ModelCardTest, PredictCollectsFilesDirectoriesAndStdinLists) {
  fs::create_directories(dir_ / "a/b");
  for (const char* f : {"a/b/2.PNG", "a/1.jpg", "a/notes.txt", "x.bin"}) std::ofstream(dir_ / f) << "x";
  std::istringstream listed((dir_ / "x.bin").string() + "\n\n" + (dir_ / "missing.png").string() + "\n");
  const std::vector<std::string> paths =
      collect_image_paths({(dir_ / "a").string(), "-", (dir_ / "x.bin").string()}, listed);
  const std::vector<std::string> expected = {(dir_ / "a/1.jpg").string(), (dir_ / "a/b/2.PNG").string(),
                                             (dir_ / "x.bin").string(), (dir_ / "missing.png").string(),
                                             (dir_ / "x.bin").string()};
  EXPECT_EQ(paths, expected);
  std::istringstream none;
  EXPECT_THROW(collect_image_paths({(dir_ / "nowhere").string()}, none), UsageError);
}

TEST_F(ModelCardTest, ABadFileIsLeftOutWithItsProblemAndTheOthersDecode) {
  const std::vector<uint8_t> grey(6 * 6, 200);
  const std::vector<uint8_t> png = encode_png(grey.data(), 6, 6, 1);
  std::ofstream(dir_ / "good.png", std::ios::binary)
      .write(reinterpret_cast<const char*>(png.data()), png.size());
  std::ofstream(dir_ / "cut.png", std::ios::binary)
      .write(reinterpret_cast<const char*>(png.data()), png.size() / 2);
  std::vector<std::string> warnings;
  ImageFiles files({(dir_ / "good.png").string(), (dir_ / "cut.png").string(), (dir_ / "gone.png").string()},
                   {4, 4, 1, {0.5f}, {0.5f}}, [&](const std::string& w) { warnings.push_back(w); });
  std::vector<uint8_t> out(16);
  Generator gen(0);
  EXPECT_EQ(files.read_augmented(0, out.data(), gen), 0);
  EXPECT_EQ(out, std::vector<uint8_t>(16, 200));
  EXPECT_EQ(files.read_augmented(1, out.data(), gen), kDroppedSample);
  EXPECT_EQ(files.read_augmented(2, out.data(), gen), kDroppedSample);
  EXPECT_NE(files.problem(1).find("PNG"), std::string::npos) << files.problem(1);
  EXPECT_NE(files.problem(2).find("cannot open"), std::string::npos) << files.problem(2);
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_NE(warnings[0].find("warning: " + (dir_ / "cut.png").string() + ": "), std::string::npos);
  EXPECT_NE(warnings[0].find("left out of the predictions"), std::string::npos) << warnings[0];
}

TEST(PredictOutput, TopClassesAreSoftmaxBestFirstTiesByIndex) {
  const float logits[] = {1.0f, 3.0f, 3.0f, -2.0f};
  const std::vector<ClassScore> top = top_classes(logits, 4, 3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].index, 1);
  EXPECT_EQ(top[1].index, 2);
  EXPECT_EQ(top[2].index, 0);
  const double sum = std::exp(1.0) + 2 * std::exp(3.0) + std::exp(-2.0);
  EXPECT_NEAR(top[0].probability, std::exp(3.0) / sum, 1e-12);
  EXPECT_EQ(top_classes(logits, 4, 10).size(), 4u);  // k capped at the class count
  EXPECT_THROW(parse_prediction_format("xml"), UsageError);
}

}  // namespace
}  // namespace trainer
