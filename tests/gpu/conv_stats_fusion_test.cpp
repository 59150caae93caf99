// train.cudnn_fusion (nn/cuda/conv_stats_fusion.h): with the fusion forced on wherever cuDNN runs it,
// a resnet18-cifar forward in bf16 takes every fused convolution's sums into the BatchNorm after it,
// and its BatchNorm statistics and logits match the unfused forward's to bf16 rounding (the fused
// engines compute the convolutions in another order); training steps, replayed from a CUDA graph,
// follow the unfused run's losses; nothing is fused under train.deterministic, in evaluation or when
// off; sums that no BatchNorm takes are dropped at the next convolution.
#include "nn/cuda/conv_stats_fusion.h"

#include <gtest/gtest.h>

#include <cmath>

#include "nn/amp/autocast.h"
#include "nn/cuda/cuda_graph.h"
#include "nn/functional.h"
#include "nn/fusion_hints.h"
#include "nn/modules/batch_norm.h"
#include "nn/optim/sgd.h"
#include "tests/gpu/backend_options.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/graph_steps.h"

namespace trainer {
namespace {

using namespace gpu_test;

// Sets the fusion mode for a test and restores "off" after it.
class FusionMode {
 public:
  explicit FusionMode(cuda::ConvStatsFusion mode) {
    testing::set_backend_option(&runtime::BackendOptions::conv_stats_fusion,
                                mode != cuda::ConvStatsFusion::off);
    testing::set_backend_option(&runtime::BackendOptions::force_conv_stats_fusion,
                                mode == cuda::ConvStatsFusion::always);
  }
  ~FusionMode() {
    testing::set_backend_option(&runtime::BackendOptions::conv_stats_fusion, false);
    testing::set_backend_option(&runtime::BackendOptions::force_conv_stats_fusion, false);
  }
};

Tensor input_batch(uint64_t seed, int64_t n = 16) {
  Generator gen(seed);
  return on_gpu(random({n, 3, 32, 32}, gen).to(DType::bf16), MemoryFormat::channels_last);
}

Tensor forward_bf16(Module& model, const Tensor& x) {
  AutocastScope autocast(DType::bf16);
  return model(Variable(x)).data().to(DType::f32).to(Device::cpu());
}

std::vector<BatchNorm2d*> batch_norms(Module& model) {
  std::vector<BatchNorm2d*> out;
  for (auto& [name, m] : model.named_modules())
    if (auto* bn = dynamic_cast<BatchNorm2d*>(m)) out.push_back(bn);
  return out;
}

TEST(ConvStatsFusion, BatchNormsTakeTheFusedSumsAndMatchTheUnfusedStatistics) {
  REQUIRE_GPU();
  testing::set_backend_option(&runtime::BackendOptions::deterministic, false);
  auto fused_model = gpu_model("resnet18", 3, 32, "cifar", 5);
  auto plain_model = gpu_model("resnet18", 3, 32, "cifar", 5);
  const Tensor x = input_batch(1);
  Tensor fused_logits;
  int64_t fused = 0, taken = 0;
  {
    const FusionMode on(cuda::ConvStatsFusion::always);
    const int64_t f0 = cuda::fused_convolutions(), t0 = cuda::batch_norms_from_sums();
    fused_logits = forward_bf16(*fused_model, x);
    fused = cuda::fused_convolutions() - f0;
    taken = cuda::batch_norms_from_sums() - t0;
  }
  const Tensor plain_logits = forward_bf16(*plain_model, x);
  EXPECT_GT(fused, 10) << "cuDNN ran the fused convolution + statistics for too few of the 20 convolutions";
  EXPECT_EQ(taken, fused) << "every fused convolution's sums go to the BatchNorm after it";
  expect_close(plain_logits, fused_logits, 5e-2, 5e-2);
  const auto a = batch_norms(*fused_model), b = batch_norms(*plain_model);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    expect_close(b[i]->running_mean().to(Device::cpu()), a[i]->running_mean().to(Device::cpu()), 2e-2, 2e-3);
    expect_close(b[i]->running_var().to(Device::cpu()), a[i]->running_var().to(Device::cpu()), 2e-2, 2e-3);
  }
}

TEST(ConvStatsFusion, NothingIsFusedWhenOffUnderDeterminismOrInEvaluation) {
  REQUIRE_GPU();
  auto model = gpu_model("resnet18", 3, 32, "cifar", 6);
  const Tensor x = input_batch(2);
  const int64_t f0 = cuda::fused_convolutions();
  forward_bf16(*model, x);  // off (the default)
  EXPECT_EQ(cuda::fused_convolutions(), f0);
  {
    const FusionMode on(cuda::ConvStatsFusion::always);
    testing::set_backend_option(&runtime::BackendOptions::deterministic, true);
    forward_bf16(*model, x);
    testing::set_backend_option(&runtime::BackendOptions::deterministic, false);
    EXPECT_EQ(cuda::fused_convolutions(), f0);
    model->eval();
    forward_bf16(*model, x);
    EXPECT_EQ(cuda::fused_convolutions(), f0);
  }
}

TEST(ConvStatsFusion, SumsThatNoBatchNormTakesAreDroppedAtTheNextConvolution) {
  REQUIRE_GPU();
  testing::set_backend_option(&runtime::BackendOptions::deterministic, false);
  const FusionMode on(cuda::ConvStatsFusion::always);
  Generator gen(3);
  const Tensor x = on_gpu(random({8, 64, 16, 16}, gen).to(DType::bf16), MemoryFormat::channels_last);
  const Tensor w = on_gpu(random({64, 64, 3, 3}, gen, DType::f32, -0.05, 0.05).to(DType::bf16),
                          MemoryFormat::channels_last);
  Conv2dParams p;
  p.pad_h = p.pad_w = 1;
  Tensor fused_y, plain_y;
  {
    const ConvFeedsBatchNormStats hint(true);
    fused_y = dev().conv2d(x, w, Tensor(), p);
  }
  plain_y = dev().conv2d(x, w, Tensor(), p);  // no hint: the usual path, and the kept sums are dropped
  expect_close(plain_y.to(DType::f32).to(Device::cpu()), fused_y.to(DType::f32).to(Device::cpu()), 1e-2,
               1e-2);
  EXPECT_FALSE(cuda::take_channel_sums(fused_y).has_value());
  {
    const ConvFeedsBatchNormStats hint(true);
    fused_y = dev().conv2d(x, w, Tensor(), p);
  }
  EXPECT_FALSE(cuda::take_channel_sums(plain_y).has_value());  // another tensor
  const auto sums = cuda::take_channel_sums(fused_y);
  ASSERT_TRUE(sums.has_value());
  EXPECT_EQ(sums->count, 8 * 16 * 16);
  EXPECT_FALSE(cuda::take_channel_sums(fused_y).has_value());  // handed out once
  // The sums are those of y.
  const std::vector<float> s = sums->sum.to_vector<float>();
  const Tensor y64 = fused_y.to(DType::f64).to(Device::cpu()).contiguous();
  const std::vector<double> yv = y64.to_vector<double>();
  for (int c = 0; c < 64; c += 9) {
    double expected = 0.0;
    for (int64_t i = 0; i < 8 * 16 * 16; ++i)
      expected += yv[static_cast<size_t>((i / 256) * 64 * 256 + c * 256 + i % 256)];
    EXPECT_NEAR(s[static_cast<size_t>(c)], expected, 1e-3 * (1.0 + std::abs(expected))) << "channel " << c;
  }
}

// 12 SGD steps, replayed from a CUDA graph after the third, with and without the fusion.
std::vector<double> losses(bool fusion) {
  const FusionMode mode(fusion ? cuda::ConvStatsFusion::always : cuda::ConvStatsFusion::off);
  auto model = gpu_model("resnet18", 3, 32, "cifar", 8);
  SgdOptions so;  // a learning rate small enough that random labels do not make the run diverge
  so.lr = 0.01;   // (a diverging run amplifies last-bit differences into different losses)
  Sgd opt(model->named_parameters(), so);
  Tensor x = input_batch(4, 32);
  Tensor y = Tensor::zeros({32}, DType::i64, gpu());
  Generator gen(10);
  Variable loss;
  auto step = [&] {
    loss = autocast_loss(*model, x, y, DType::bf16);
    loss.backward();
    opt.step();
    opt.zero_grad();
  };
  return run_graph_steps({.steps = 12,
                          .capture_at = 3,
                          .load_batch =
                              [&](int i) {
                                x.copy_(input_batch(100 + i, 32));
                                random_labels(y, gen);
                              },
                          .step = step,
                          .loss = [&] { return loss.item(); }});
}

TEST(ConvStatsFusion, TrainingStepsReplayedFromAGraphFollowTheUnfusedLosses) {
  REQUIRE_GPU();
  testing::set_backend_option(&runtime::BackendOptions::deterministic, false);
  const std::vector<double> fused = losses(true), plain = losses(false);
  ASSERT_EQ(fused.size(), plain.size());
  for (size_t i = 0; i < fused.size(); ++i) {
    EXPECT_TRUE(std::isfinite(fused[i])) << i;
    EXPECT_NEAR(fused[i], plain[i], 0.05 * std::abs(plain[i]) + 0.02) << "step " << i;
  }
}

}  // namespace
}  // namespace trainer
