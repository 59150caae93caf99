// run_step, the one step function: the phases it reports in order, accumulation over micro-batches, the
// learning rate the driver gives, the update, and an input that runs out before the step is complete.
#include "app/train/step_function.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "nn/models/registry.h"
#include "nn/optim/sgd.h"
#include "nn/random.h"
#include "tiny_mlp.h"

namespace trainer {
namespace {

// Records what run_step asks and tells; feeds `available` micro-batches of one fixed batch.
class RecordingDriver : public StepDriver {
 public:
  RecordingDriver(const Tensor& images, const Tensor& labels, int available)
      : images_(images), labels_(labels), available_(available) {}
  std::optional<StepInput> next(int micro) override {
    events.push_back("next " + std::to_string(micro));
    if (micro >= available_) return std::nullopt;
    return StepInput{images_, labels_};
  }
  void begin(Phase p) override { events.push_back("begin " + std::string(phase_name(p))); }
  void end(Phase p) override { events.push_back("end " + std::string(phase_name(p))); }
  void micro_batch_done(Variable loss, int micro) override {
    events.push_back("done " + std::to_string(micro));
    losses.push_back(loss.item());
  }
  void reduced() override { events.push_back("reduced"); }
  std::optional<double> learning_rate() override { return 0.125; }
  void scaler_updated() override { events.push_back("scaler updated"); }

  std::vector<std::string> events;
  std::vector<double> losses;

 private:
  const Tensor& images_;
  const Tensor& labels_;
  int available_;
};

// A small model, its optimizer and a batch: what a step works on.
struct StepSetup {
  StepSetup() {
    model_ = testing::tiny_mlp();
    SgdOptions so;
    so.lr = 0.5;
    optimizer_ = std::make_unique<Sgd>(model_->named_parameters(), so);
    params_ = model_->parameters();
    Generator gen(7);
    images_ = Tensor::empty({6, 1, 4, 4});
    normal_(images_, 0, 1, gen);
    labels_ = Tensor::from_vector<int64_t>({0, 1, 2, 0, 1, 2}, {6});
  }
  StepParts parts(int accum) {
    return StepParts{.model = *model_,
                     .optimizer = *optimizer_,
                     .scaler = scaler_,
                     .params = params_,
                     .accum = accum,
                     .all_ranks_finite = {},
                     .agree_found_inf = {}};
  }

  std::shared_ptr<Module> model_;
  std::unique_ptr<Sgd> optimizer_;
  LossScaler scaler_;  // disabled: scale 1
  std::vector<Variable> params_;
  Tensor images_, labels_;
};

class StepFunctionTest : public ::testing::Test, protected StepSetup {};

TEST_F(StepFunctionTest, ReportsItsPhasesInOrderAndUpdatesWithTheDriversLearningRate) {
  const std::vector<float> before = params_.front().data().to_vector<float>();
  RecordingDriver driver(images_, labels_, 2);
  ASSERT_TRUE(run_step(parts(2), driver));
  const std::vector<std::string> expected = {"next 0",
                                             "begin forward",
                                             "end forward",
                                             "begin backward",
                                             "end backward",
                                             "done 0",
                                             "next 1",
                                             "begin forward",
                                             "end forward",
                                             "begin backward",
                                             "end backward",
                                             "done 1",
                                             "begin allreduce_exposed",
                                             "end allreduce_exposed",
                                             "reduced",
                                             "begin optimizer",
                                             "scaler updated",
                                             "end optimizer"};
  EXPECT_EQ(driver.events, expected);
  EXPECT_EQ(driver.losses.size(), 2u);
  EXPECT_EQ(optimizer_->lr(), 0.125);
  EXPECT_NE(params_.front().data().to_vector<float>(), before);
  // The gradients are zeroed for the next step.
  for (const Variable& p : params_)
    if (p.grad().defined())
      for (float g : p.grad().to_vector<float>()) EXPECT_EQ(g, 0.0f);
}

TEST_F(StepFunctionTest, AnInputThatRunsOutLeavesTheStepIncompleteAndTheWeightsAlone) {
  const std::vector<float> before = params_.front().data().to_vector<float>();
  RecordingDriver driver(images_, labels_, 1);
  EXPECT_FALSE(run_step(parts(2), driver));
  EXPECT_EQ(driver.events.back(), "next 1");
  EXPECT_EQ(params_.front().data().to_vector<float>(), before);
  EXPECT_EQ(optimizer_->lr(), 0.5);
}

TEST_F(StepFunctionTest, AccumulatedMicroBatchesEqualTheirMeanInOneStep) {
  // Two micro-batches of the same batch at 1/2 each give the gradient of one: the same update.
  RecordingDriver twice(images_, labels_, 2);
  ASSERT_TRUE(run_step(parts(2), twice));
  const std::vector<float> accumulated = params_.front().data().to_vector<float>();

  StepSetup fresh;
  RecordingDriver once(fresh.images_, fresh.labels_, 1);
  ASSERT_TRUE(run_step(fresh.parts(1), once));
  const std::vector<float> single = fresh.params_.front().data().to_vector<float>();
  ASSERT_EQ(accumulated.size(), single.size());
  for (size_t i = 0; i < single.size(); ++i) EXPECT_NEAR(accumulated[i], single[i], 1e-6) << i;
}

}  // namespace
}  // namespace trainer
