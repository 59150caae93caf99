// step_graph_blocker: which runs train.cuda_graph captures, and the reason the log gives for the others.
#include "app/train/step_graph.h"

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
  EXPECT_EQ(blocker_with([](Config& c) { c.train.precision = Precision::bf16; }), "");
  EXPECT_EQ(blocker_with([](Config& c) { c.optim.name = OptimizerKind::adamw; }), "");
  // fp16 with SGD: the loss scaler decides on the device, inside the captured step.
  EXPECT_EQ(blocker_with([](Config& c) { c.train.precision = Precision::fp16; }), "");
}

// Several ranks: captured (with the all-reduce) only when asked for, since the per-phase times go.
TEST(StepGraphBlocker, SeveralRanksAreCapturedOnlyWithDistCudaGraph) {
  const std::string off = blocker_with([](Config&) {}, 2);
  EXPECT_NE(off.find("2 ranks and dist.cuda_graph = false"), std::string::npos) << off;
  EXPECT_EQ(blocker_with([](Config& c) { c.dist.cuda_graph = true; }, 2), "");
  EXPECT_EQ(blocker_with(
                [](Config& c) {
                  c.dist.cuda_graph = true;
                  c.train.precision = Precision::fp16;
                },
                4),
            "");
  EXPECT_NE(blocker_with(
                [](Config& c) {
                  c.dist.cuda_graph = true;
                  c.dist.backend = CommBackendChoice::tcp;  // the parser reads "gloo" as "tcp"
                },
                2)
                .find("dist.backend = \"tcp\""),
            std::string::npos);
  // train.cuda_graph stays the master switch; dist.cuda_graph means nothing at one rank.
  EXPECT_EQ(blocker_with(
                [](Config& c) {
                  c.dist.cuda_graph = true;
                  c.train.cuda_graph = false;
                },
                2),
            "train.cuda_graph = false");
  EXPECT_EQ(blocker_with([](Config& c) { c.dist.cuda_graph = true; }, 1), "");
}

TEST(StepGraphBlocker, EachFeatureThatNeedsTheHostInAStepNamesItsKey) {
  EXPECT_EQ(blocker_with([](Config& c) { c.train.cuda_graph = false; }), "train.cuda_graph = false");
  EXPECT_NE(blocker_with([](Config& c) {
              c.train.precision = Precision::fp16;
              c.dist.zero_stage = 1;
            }).find("dist.zero_stage"),
            std::string::npos);
  // Clipping is captured, fp16 or not: the norm and the coefficient stay on the device.
  EXPECT_EQ(blocker_with([](Config& c) {
              c.train.precision = Precision::fp16;
              c.optim.clip_grad_norm = 1.0;
            }),
            "");
  EXPECT_EQ(blocker_with([](Config& c) { c.optim.clip_grad_norm = 1.0; }), "");
  // fp16 with AdamW or SGD is captured: both skip on the device scaler's flag exactly.
  EXPECT_EQ(blocker_with([](Config& c) {
              c.train.precision = Precision::fp16;
              c.optim.name = OptimizerKind::adamw;
            }),
            "");
  EXPECT_EQ(blocker_with([](Config& c) { c.train.precision = Precision::fp16; }), "");
  EXPECT_NE(blocker_with([](Config& c) { c.train.grad_accum_steps = 2; }).find("train.grad_accum_steps"),
            std::string::npos);
  EXPECT_NE(blocker_with([](Config& c) { c.model.dropout = 0.1; }).find("model.dropout"), std::string::npos);
  EXPECT_NE(blocker_with([](Config& c) { c.dist.zero_stage = 1; }).find("dist.zero_stage"),
            std::string::npos);
}

// Which batches replay the graph: none before a warm-up step of their shape, then only the shape (and
// dtypes) the graph was captured with; an epoch's smaller last batch runs eagerly.
TEST(StepGraphBatches, TheWarmUpShapeIsCapturedAndOtherShapesRunEagerly) {
  StepGraph graph;
  const Tensor images = Tensor::zeros({32, 3, 8, 8}), labels = Tensor::zeros({32}, DType::i64);
  const Tensor last_images = Tensor::zeros({12, 3, 8, 8}), last_labels = Tensor::zeros({12}, DType::i64);
  EXPECT_FALSE(graph.accepts(images, labels));  // no warm-up step yet
  graph.note_eager_step(images, labels);
  EXPECT_TRUE(graph.accepts(images, labels));
  EXPECT_FALSE(graph.accepts(last_images, last_labels));
  graph.load(images, labels);  // the graph's inputs now exist: their shape is the captured one
  EXPECT_EQ(graph.images().shape(), images.shape());
  graph.note_eager_step(last_images, last_labels);  // an eager last batch does not change it
  EXPECT_TRUE(graph.accepts(images, labels));
  EXPECT_FALSE(graph.accepts(last_images, last_labels));
  EXPECT_FALSE(graph.accepts(images.to(DType::f64), labels));  // another dtype is another graph
  EXPECT_FALSE(graph.captured());
}

// fp16's loss scaler stays on the host only where the sharded optimizer unscales its own shard (both
// optimizers skip on a device flag exactly, and clipping stays on the device).
TEST(LossScalerHostReason, OnlyZeroKeepsTheScalerOnTheHost) {
  EXPECT_EQ(loss_scaler_host_reason(Config{}), "");
  Config adamw;
  adamw.optim.name = OptimizerKind::adamw;
  EXPECT_EQ(loss_scaler_host_reason(adamw), "");
  Config clip;
  clip.optim.clip_grad_norm = 1.0;
  EXPECT_EQ(loss_scaler_host_reason(clip), "");
  Config zero;
  zero.dist.zero_stage = 2;
  EXPECT_EQ(loss_scaler_host_reason(zero), "dist.zero_stage");
}

}  // namespace
}  // namespace trainer
