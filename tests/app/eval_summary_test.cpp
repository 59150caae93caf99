// `trainer eval --summary PATH` writes what eval measured, not a training summary full of zeros; eval
// and predict refuse a GPU precision on the CPU as train does.
#include "app/commands/train_eval/eval_summary.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "trainer_process.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;
using testing::read_file;
using testing::run_trainer;
using testing::RunResult;

class EvalSummaryRun : public testing::TrainerRunTest {
 protected:
  EvalSummaryRun() : TrainerRunTest("trainer_eval_summary_") {}
  // Trains the small config for 2 steps; returns the config and its final weights.
  std::pair<std::string, std::string> trained() {
    const std::string cfg = write_small_config("[train]\nmax_steps = 2\n");
    const RunResult r = run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("a"));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return {cfg, run_dir("a") + "/checkpoints/final.safetensors"};
  }
};

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST_F(EvalSummaryRun, WritesEvalShapedJsonWithPerClassAccuracy) {
  const auto [cfg, weights] = trained();
  const std::string summary = (dir_ / "eval.json").string();
  const RunResult e = run_trainer("eval " + cfg + " --weights " + weights + " --summary " + summary);
  ASSERT_EQ(e.exit_code, 0) << e.output;
  const std::string json = read_file(summary);
  for (const char* key : {"\"mode\": \"eval\"", "\"loss\": ", "\"top1\": ", "\"top5\": ", "\"auc\": ",
                          "\"images\": 51", "\"per_class_accuracy\": ["})
    EXPECT_NE(json.find(key), std::string::npos) << key << " in " << json;
  EXPECT_NE(json.find("\"weights\": \"" + weights + "\""), std::string::npos) << json;
  EXPECT_EQ(count_of(json, "\"class\": "), 10u) << json;  // every class eval printed
  for (const char* train_only : {"train_seconds", "samples_per_second", "world_size", "best_test_accuracy"})
    EXPECT_EQ(json.find(train_only), std::string::npos) << train_only << " in " << json;
}

// A GPU precision on the CPU: eval, predict and plan stop with train's config error (key and hint), not
// with a kernel's dtype error.
TEST_F(EvalSummaryRun, AHalfPrecisionOnTheCpuIsAConfigError) {
  const auto [cfg, weights] = trained();
  for (const std::string command : {"eval " + cfg + " --weights " + weights,
                                    "predict " + cfg + " --weights " + weights + " " + weights}) {
    const RunResult r = run_trainer(command + " --set train.device=cpu --set train.precision=bf16");
    EXPECT_NE(r.exit_code, 0) << command << "\n" << r.output;
    EXPECT_NE(r.output.find("train.precision: 'bf16' is a GPU precision"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("HINT: set train.precision = \"fp32\""), std::string::npos) << r.output;
  }
}

TEST(EvalSummaryJson, NanIsNullAndClassesWithoutNameUseTheirIndex) {
  EvalSummary s{.weights = "w.safetensors",
                .dataset = "test",
                .images = 3,
                .loss = 1.5,
                .top1 = 0.5,
                .top5 = 1.0,
                .auc = NAN,
                .class_names = {"cat"},
                .per_class_accuracy = {1.0, 0.25}};
  const std::string json = eval_summary_json(s);
  EXPECT_NE(json.find("\"auc\": null"), std::string::npos) << json;
  const auto classes = nlohmann::json::parse(json).at("per_class_accuracy");
  ASSERT_EQ(classes.size(), 2u) << json;
  EXPECT_EQ(classes[0], nlohmann::json({{"class", "cat"}, {"accuracy", 1.0}})) << json;
  EXPECT_EQ(classes[1], nlohmann::json({{"class", "1"}, {"accuracy", 0.25}})) << json;
}

}  // namespace
}  // namespace trainer
