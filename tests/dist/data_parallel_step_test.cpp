// run_step, the one step function: the phases it reports in order, accumulation over micro-batches, the
// learning rate it is given, the update, an input that runs out before the step is complete, a loss
// checked on the host, and the fault-injection hook between the reduce and the update.
#include "dist/data_parallel_step.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "app/tiny_mlp.h"
#include "nn/optim/sgd.h"
#include "nn/random.h"

namespace trainer {
namespace {

// Records the phases the step reports.
class RecordingTimer : public PhaseTimer {
 public:
  void begin(Phase p) override { events.push_back("begin " + std::string(phase_name(p))); }
  void end(Phase p) override { events.push_back("end " + std::string(phase_name(p))); }
  bool is_open(Phase) const override { return false; }
  std::vector<std::string> events;
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
                     .check_losses_on_host = true,
                     .all_ranks_finite = {},
                     .agree_found_inf = {}};
  }
  // `available` micro-batches of the one batch, each request recorded in `events`.
  MicroBatchSource source(int available, std::vector<std::string>* events = nullptr) {
    return [this, available, events](int micro) -> std::optional<StepInput> {
      if (events) events->push_back("next " + std::to_string(micro));
      if (micro >= available) return std::nullopt;
      return StepInput{images_, labels_};
    };
  }

  std::shared_ptr<Module> model_;
  std::unique_ptr<Sgd> optimizer_;
  LossScaler scaler_;  // disabled: scale 1
  std::vector<Variable> params_;
  Tensor images_, labels_;
};

class DataParallelStepTest : public ::testing::Test, protected StepSetup {};

TEST_F(DataParallelStepTest, ReportsItsPhasesInOrderAndUpdatesWithTheGivenLearningRate) {
  const std::vector<float> before = params_.front().data().to_vector<float>();
  RecordingTimer timer;
  const StepOutcome outcome = run_step(parts(2), source(2, &timer.events), 0.125, &timer);
  const std::vector<std::string> expected = {"next 0",
                                             "begin forward",
                                             "end forward",
                                             "begin backward",
                                             "end backward",
                                             "next 1",
                                             "begin forward",
                                             "end forward",
                                             "begin backward",
                                             "end backward",
                                             "begin allreduce_exposed",
                                             "end allreduce_exposed",
                                             "begin optimizer",
                                             "end optimizer"};
  EXPECT_EQ(timer.events, expected);
  EXPECT_EQ(outcome.end, StepOutcome::End::updated);
  ASSERT_EQ(outcome.losses.size(), 2u);
  EXPECT_TRUE(std::isfinite(outcome.losses[0].item()));
  EXPECT_EQ(optimizer_->lr(), 0.125);
  EXPECT_NE(params_.front().data().to_vector<float>(), before);
  // The gradients are zeroed for the next step.
  for (const Variable& p : params_)
    if (p.grad().defined())
      for (float g : p.grad().to_vector<float>()) EXPECT_EQ(g, 0.0f);
}

TEST_F(DataParallelStepTest, AnInputThatRunsOutLeavesTheStepIncompleteAndTheWeightsAlone) {
  const std::vector<float> before = params_.front().data().to_vector<float>();
  std::vector<std::string> requests;
  const StepOutcome outcome = run_step(parts(2), source(1, &requests), 0.125, nullptr);
  EXPECT_EQ(outcome.end, StepOutcome::End::input_ran_out);
  EXPECT_EQ(requests.back(), "next 1");
  EXPECT_EQ(params_.front().data().to_vector<float>(), before);
  EXPECT_EQ(optimizer_->lr(), 0.5);
}

TEST_F(DataParallelStepTest, AccumulatedMicroBatchesEqualTheirMeanInOneStep) {
  // Two micro-batches of the same batch at 1/2 each give the gradient of one: the same update.
  ASSERT_EQ(run_step(parts(2), source(2), std::nullopt, nullptr).end, StepOutcome::End::updated);
  const std::vector<float> accumulated = params_.front().data().to_vector<float>();

  StepSetup fresh;
  ASSERT_EQ(run_step(fresh.parts(1), fresh.source(1), std::nullopt, nullptr).end, StepOutcome::End::updated);
  const std::vector<float> single = fresh.params_.front().data().to_vector<float>();
  ASSERT_EQ(accumulated.size(), single.size());
  for (size_t i = 0; i < single.size(); ++i) EXPECT_NEAR(accumulated[i], single[i], 1e-6) << i;
}

TEST_F(DataParallelStepTest, ANonFiniteLossCheckedOnTheHostStopsTheStepBeforeItsBackward) {
  const std::vector<float> before = params_.front().data().to_vector<float>();
  params_.back().data().fill_(std::numeric_limits<double>::quiet_NaN());  // the last layer's bias
  RecordingTimer timer;
  const StepOutcome outcome = run_step(parts(1), source(1), 0.125, &timer);
  EXPECT_EQ(outcome.end, StepOutcome::End::non_finite_loss);
  ASSERT_EQ(outcome.losses.size(), 1u);
  EXPECT_TRUE(std::isnan(outcome.losses[0].item()));
  EXPECT_EQ(timer.events.back(), "end forward");
  EXPECT_EQ(params_.front().data().to_vector<float>(), before);
}

TEST_F(DataParallelStepTest, TheHookRunsAfterTheReduceAndAnInfGradientSkipsTheUpdateUnderAScaler) {
  LossScalerOptions so;
  so.enabled = true;
  so.init_scale = 1024;
  LossScaler scaler(so);
  StepParts with_scaler = parts(1);
  StepParts scaled{.model = with_scaler.model,
                   .optimizer = with_scaler.optimizer,
                   .scaler = scaler,
                   .params = with_scaler.params,
                   .check_losses_on_host = true};
  const std::vector<float> before = params_.front().data().to_vector<float>();
  RecordingTimer timer;
  const StepOutcome outcome = run_step(scaled, source(1), 0.125, &timer, [&] {
    timer.events.push_back("hook");
    Variable first = params_.front();
    first.grad().fill_(std::numeric_limits<double>::infinity());
  });
  EXPECT_EQ(outcome.end, StepOutcome::End::skipped);
  EXPECT_EQ(outcome.loss_scale, 1024);
  EXPECT_LT(scaler.scale(), 1024);
  const std::vector<std::string> tail(timer.events.end() - 4, timer.events.end());
  EXPECT_EQ(tail,
            (std::vector<std::string>{"end allreduce_exposed", "hook", "begin optimizer", "end optimizer"}));
  EXPECT_EQ(params_.front().data().to_vector<float>(), before);
}

}  // namespace
}  // namespace trainer
