// SyncBatchNorm on N ranks with B/N samples each must equal BatchNorm2d on one rank with all B samples
// (outputs, running statistics, input/weight/bias gradients), also with uneven shards; at world size 1
// it must be BatchNorm2d bit for bit. average_bn_running_stats averages running statistics.
#include "dist/sync_batch_norm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "dist/bn_stats.h"
#include "multi_process.h"
#include "nn/functional.h"
#include "nn/modules/conv.h"

namespace trainer {
namespace {

using namespace testing;

constexpr int64_t kC = 3, kH = 2, kW = 3;

std::vector<float> pattern(int64_t n, float scale, float shift) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = scale * std::sin(0.37f * i + shift) + 0.1f * shift;
  return v;
}

// Sample rows [begin, end) of a [B, C, H, W] pattern that differs per step.
Tensor samples(int64_t begin, int64_t end, int step, float scale, float shift) {
  const int64_t per = kC * kH * kW;
  std::vector<float> all = pattern(end * per, scale, shift + 5.0f * step);
  std::vector<float> mine(all.begin() + begin * per, all.end());
  return Tensor::from_vector(mine, {end - begin, kC, kH, kW});
}

void init_bn(BatchNorm2d& bn) {
  bn.weight().data().copy_(Tensor::from_vector<float>({1.5f, -0.5f, 0.8f}, {kC}));
  bn.bias().data().copy_(Tensor::from_vector<float>({0.1f, 0.2f, -0.3f}, {kC}));
  bn.running_mean().copy_(Tensor::from_vector<float>({0.3f, -0.2f, 0.0f}, {kC}));
  bn.running_var().copy_(Tensor::from_vector<float>({1.2f, 0.7f, 1.0f}, {kC}));
}

struct StepResult {
  std::vector<float> y, grad_x, grad_w, grad_b;
};

// One training step of `bn` on rows [begin, end): loss = sum(y * r), a different r per sample.
StepResult run_step(BatchNorm2d& bn, int64_t begin, int64_t end, int step) {
  Variable x(samples(begin, end, step, 2.0f, 0.3f), true);
  const Variable r(samples(begin, end, step, 1.0f, 1.7f));
  bn.zero_grad();
  Variable y = bn(x);
  F::sum(F::mul(y, r)).backward();
  return {y.data().to_vector<float>(), x.grad().to_vector<float>(), bn.weight().grad().to_vector<float>(),
          bn.bias().grad().to_vector<float>()};
}

void expect_near(const std::vector<float>& got, const std::vector<float>& want, size_t offset,
                 const std::string& what) {
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(got[i] - want[offset + i]) <= 1e-5f * (1.0f + std::abs(want[offset + i]))))
      throw std::runtime_error(what + "[" + std::to_string(i) + "] = " + std::to_string(got[i]) + ", want " +
                               std::to_string(want[offset + i]));
}

// Every rank holds counts[rank] samples of the global batch; two steps, so the second one normalises
// after running statistics were updated once.
void check_against_one_rank(const std::vector<int64_t>& counts) {
  const int world = static_cast<int>(counts.size());
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  const int port = free_port();
  const auto out = run_processes(world, [&](int rank) {
    Rank me(rank, world, port, 10s);
    int64_t begin = 0;
    for (int r = 0; r < rank; ++r) begin += counts[r];
    const int64_t end = begin + counts[rank];
    const size_t per = kC * kH * kW;
    SyncBatchNorm sync(kC, me.comm);
    BatchNorm2d ref(kC);
    init_bn(sync);
    init_bn(ref);
    if (!is_sync_batch_norm(sync)) throw std::runtime_error("SyncBatchNorm does not synchronise");
    for (int step = 0; step < 2; ++step) {
      const std::string at = "step " + std::to_string(step) + " ";
      const StepResult got = run_step(sync, begin, end, step);
      const StepResult want = run_step(ref, 0, total, step);
      expect_near(got.y, want.y, begin * per, at + "y");
      expect_near(got.grad_x, want.grad_x, begin * per, at + "grad x");
      // Weight and bias gradients are this rank's sums; the reducer combines them (here: summed).
      Tensor gw = Tensor::from_vector(got.grad_w, {kC}), gb = Tensor::from_vector(got.grad_b, {kC});
      me.comm->all_reduce(gw, ReduceOp::sum);
      me.comm->all_reduce(gb, ReduceOp::sum);
      expect_near(gw.to_vector<float>(), want.grad_w, 0, at + "grad weight");
      expect_near(gb.to_vector<float>(), want.grad_b, 0, at + "grad bias");
      expect_near(sync.running_mean().to_vector<float>(), ref.running_mean().to_vector<float>(), 0,
                  at + "running_mean");
      expect_near(sync.running_var().to_vector<float>(), ref.running_var().to_vector<float>(), 0,
                  at + "running_var");
      if (sync.num_batches_tracked().item() != step + 1) throw std::runtime_error(at + "num_batches_tracked");
    }
    // Evaluation uses the running statistics and communicates nothing: ranks may evaluate different
    // numbers of batches (rank 0 does one more here) without a collective hanging.
    sync.eval();
    ref.eval();
    for (int i = 0; i < (rank == 0 ? 2 : 1); ++i) {
      NoGradGuard no_grad;
      const Tensor x = samples(begin, end, 7, 2.0f, 0.3f);
      expect_near(sync(Variable(x)).data().to_vector<float>(), ref(Variable(x)).data().to_vector<float>(), 0,
                  "eval y");
    }
    me.comm->shutdown();
  });
  for (const auto& o : out) EXPECT_TRUE(o.ok()) << all_errors(out);
}

TEST(SyncBatchNorm, TwoRanksEqualOneRankWithTheWholeBatch) { check_against_one_rank({4, 4}); }
TEST(SyncBatchNorm, UnevenBatchesFiveAndThree) { check_against_one_rank({5, 3}); }
TEST(SyncBatchNorm, ThreeRanks) { check_against_one_rank({3, 2, 3}); }

TEST(SyncBatchNorm, WorldSizeOneIsBatchNorm2dExactly) {
  auto single = std::make_shared<SingleProcessComm>();
  SyncBatchNorm sync(kC, single);
  BatchNorm2d ref(kC);
  init_bn(sync);
  init_bn(ref);
  for (int step = 0; step < 2; ++step) {
    const StepResult got = run_step(sync, 0, 6, step), want = run_step(ref, 0, 6, step);
    EXPECT_EQ(got.y, want.y);
    EXPECT_EQ(got.grad_x, want.grad_x);
    EXPECT_EQ(got.grad_w, want.grad_w);
    EXPECT_EQ(got.grad_b, want.grad_b);
    EXPECT_EQ(sync.running_mean().to_vector<float>(), ref.running_mean().to_vector<float>());
    EXPECT_EQ(sync.running_var().to_vector<float>(), ref.running_var().to_vector<float>());
  }
  EXPECT_EQ(sync.num_batches_tracked().item(), 2);
}

// BatchNorm2d::forward(x, residual, relu) under SyncBatchNorm runs the tail as separate ops after
// the synchronised normalisation; it must equal the fused tail of a plain BatchNorm2d.
TEST(SyncBatchNorm, ResidualReluTailEqualsTheFusedOne) {
  SyncBatchNorm sync(kC, std::make_shared<SingleProcessComm>());
  BatchNorm2d ref(kC);
  init_bn(sync);
  init_bn(ref);
  auto run = [](BatchNorm2d& bn) {
    Variable x(samples(0, 6, 0, 2.0f, 0.3f), true), residual(samples(0, 6, 0, 1.0f, -0.4f), true);
    const Variable r(samples(0, 6, 0, 1.0f, 1.7f));
    bn.zero_grad();
    Variable y = bn.forward(x, residual, true);
    F::sum(F::mul(y, r)).backward();
    return std::vector<std::vector<float>>{
        y.data().to_vector<float>(), x.grad().to_vector<float>(), residual.grad().to_vector<float>(),
        bn.weight().grad().to_vector<float>(), bn.bias().grad().to_vector<float>()};
  };
  const auto got = run(sync), want = run(ref);
  const char* names[] = {"y", "grad_x", "grad_residual", "grad_w", "grad_b"};
  for (size_t k = 0; k < got.size(); ++k) expect_near(got[k], want[k], 0, names[k]);
  EXPECT_GT(std::count(got[0].begin(), got[0].end(), 0.0f), 0) << "the ReLU should clip some outputs";
}

TEST(SyncBatchNorm, SameNamesAsBatchNorm2d) {
  SyncBatchNorm sync(kC, std::make_shared<SingleProcessComm>());
  BatchNorm2d ref(kC);
  const auto a = sync.state_dict(), b = ref.state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].tensor->shape(), b[i].tensor->shape());
    EXPECT_EQ(a[i].is_buffer, b[i].is_buffer);
  }
}

// Like the real models: the BN layer is held by a typed member and called directly in forward.
class ConvBn : public Module {
 public:
  ConvBn() {
    Generator gen(3);
    conv_ = register_module("conv", std::make_shared<Conv2d>(kC, 4, 1, 1, 0, 1, 1, false, gen));
    bn_ = register_module("bn", std::make_shared<BatchNorm2d>(4));
  }
  Variable forward(const Variable& x) override { return bn_->forward(conv_->forward(x)); }
  std::shared_ptr<BatchNorm2d> bn_;

 private:
  std::shared_ptr<Conv2d> conv_;
};

TEST(ConvertSyncBatchnorm, ConvertsInPlaceKeepingParametersAndNames) {
  const int port = free_port();
  const auto out = run_processes(2, [&](int rank) {
    Rank me(rank, 2, port, 10s);
    ConvBn model, ref;
    std::vector<std::string> names_before;
    std::vector<const void*> params_before;
    for (auto& p : model.named_parameters()) {
      names_before.push_back(p.name);
      params_before.push_back(p.param.impl());
    }
    if (convert_sync_batchnorm(model, me.comm) != 1) throw std::runtime_error("expected 1 converted layer");
    if (!is_sync_batch_norm(*model.bn_)) throw std::runtime_error("not converted");
    const auto after = model.named_parameters();
    for (size_t i = 0; i < after.size(); ++i)
      if (after[i].name != names_before[i] || after[i].param.impl() != params_before[i])
        throw std::runtime_error("parameters changed by the conversion: " + after[i].name);
    // Rank r's half of the batch through the converted model = the whole batch through the reference.
    const int64_t begin = rank * 3, end = begin + 3;
    Variable y = model(Variable(samples(begin, end, 0, 1.0f, 0.9f)));
    Variable y_ref = ref(Variable(samples(0, 6, 0, 1.0f, 0.9f)));
    expect_near(y.data().to_vector<float>(), y_ref.data().to_vector<float>(), begin * 4 * kH * kW, "y");
    expect_near(model.bn_->running_mean().to_vector<float>(), ref.bn_->running_mean().to_vector<float>(), 0,
                "running_mean");
    me.comm->shutdown();
  });
  for (const auto& o : out) EXPECT_TRUE(o.ok()) << all_errors(out);
}

TEST(ConvertSyncBatchnorm, WorldSizeOneLeavesBatchNorm2d) {
  ConvBn model;
  EXPECT_EQ(convert_sync_batchnorm(model, std::make_shared<SingleProcessComm>()), 1);
  EXPECT_FALSE(is_sync_batch_norm(*model.bn_));
}

TEST(AverageBnRunningStats, AveragesMeanAndVarNotTheCount) {
  const int world = 3, port = free_port();
  const auto out = run_processes(world, [&](int rank) {
    Rank me(rank, world, port, 10s);
    ConvBn model;
    auto& bn = *model.bn_;
    bn.running_mean().copy_(Tensor::from_vector<float>({1.0f * rank, 2.0f, -1.0f * rank, 0.5f}, {4}));
    bn.running_var().copy_(Tensor::from_vector<float>({1.0f + rank, 3.0f, 0.5f * rank, 6.0f * rank}, {4}));
    bn.num_batches_tracked().fill_(7 + rank);
    if (average_bn_running_stats(model, *me.comm) != 1) throw std::runtime_error("expected 1 layer");
    expect_near(bn.running_mean().to_vector<float>(), {1.0f, 2.0f, -1.0f, 0.5f}, 0, "running_mean");
    expect_near(bn.running_var().to_vector<float>(), {2.0f, 3.0f, 0.5f, 6.0f}, 0, "running_var");
    if (bn.num_batches_tracked().item() != 7 + rank) throw std::runtime_error("num_batches_tracked changed");
    // Bitwise identical on every rank.
    const auto all = me.comm->all_gather(bn.running_var());
    for (const auto& t : all)
      if (t.to_vector<float>() != all[0].to_vector<float>()) throw std::runtime_error("ranks differ");
    me.comm->shutdown();
  });
  for (const auto& o : out) EXPECT_TRUE(o.ok()) << all_errors(out);
}

}  // namespace
}  // namespace trainer
