// step_graph_blocker: which runs train.cuda_graph captures, and the reason the log gives for the others.
#include "app/step_graph.h"

#include <gtest/gtest.h>

#include <string>

namespace trainer {
namespace {

std::string blocker_with(void (*change)(Config&), int world_size = 1) {
  Config config;
  change(config);
  return step_graph_blocker(config, world_size);
}

TEST(StepGraphBlocker, TheDefaultSingleRankRunIsCaptured) {
  EXPECT_EQ(step_graph_blocker(Config{}, 1), "");
  EXPECT_EQ(blocker_with([](Config& c) { c.train.precision = "bf16"; }), "");
  EXPECT_EQ(blocker_with([](Config& c) { c.optim.name = "adamw"; }), "");
}

TEST(StepGraphBlocker, EachFeatureThatNeedsTheHostInAStepNamesItsKey) {
  EXPECT_EQ(blocker_with([](Config& c) { c.train.cuda_graph = false; }), "train.cuda_graph = false");
  EXPECT_NE(blocker_with([](Config&) {}, 2).find("2 ranks"), std::string::npos);
  EXPECT_NE(blocker_with([](Config& c) { c.train.precision = "fp16"; }).find("train.precision = \"fp16\""),
            std::string::npos);
  EXPECT_NE(blocker_with([](Config& c) { c.train.grad_accum_steps = 2; }).find("train.grad_accum_steps"),
            std::string::npos);
  EXPECT_NE(blocker_with([](Config& c) { c.optim.clip_grad_norm = 1.0; }).find("optim.clip_grad_norm"),
            std::string::npos);
  EXPECT_NE(blocker_with([](Config& c) { c.model.dropout = 0.1; }).find("model.dropout"), std::string::npos);
  EXPECT_NE(blocker_with([](Config& c) { c.dist.zero_stage = 1; }).find("dist.zero_stage"),
            std::string::npos);
}

}  // namespace
}  // namespace trainer
