#include "dist/zero_optimizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "dist/error.h"
#include "dist/gradient_reducer.h"
#include "multi_process.h"
#include "nn/allocator.h"
#include "nn/amp/loss_scaler.h"
#include "nn/functional.h"
#include "nn/modules/linear.h"
#include "nn/optim/adamw.h"
#include "nn/optim/lamb.h"
#include "nn/optim/lars.h"
#include "nn/optim/sgd.h"
#include "nn/safetensors.h"

namespace trainer {
namespace {

using namespace testing;

// 6*8 + 8 + 8*3 + 3 = 83 trainable elements: padded to 84 at 2 and 3 ranks, and every shard boundary
// falls inside a parameter.
struct Mlp : Module {
  Mlp() {
    Generator gen(5);
    fc1 = register_module("fc1", std::make_shared<Linear>(6, 8, true, gen));
    fc2 = register_module("fc2", std::make_shared<Linear>(8, 3, true, gen));
  }
  Variable forward(const Variable& x) override { return fc2->forward(F::relu(fc1->forward(x))); }
  std::shared_ptr<Linear> fc1, fc2;
};
constexpr int64_t kElements = 83;

// Rank `rank`'s micro-batch `micro` of step `step`: [4, 6], different everywhere.
Tensor data(int rank, int step, int micro) {
  std::vector<float> v;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 6; ++j)
      v.push_back(std::sin(0.9f * i + 1.3f * j + 7.0f * step + 3.1f * micro + 31.0f * rank));
  return Tensor::from_vector(v, {4, 6});
}

enum class Opt { sgd, adamw };

std::unique_ptr<Optimizer> make_optimizer(Module& m, Opt opt) {
  if (opt == Opt::sgd) {
    SgdOptions o;
    o.lr = 0.05;
    o.momentum = 0.9;
    o.nesterov = true;
    o.weight_decay = 1e-2;
    return std::make_unique<Sgd>(m.named_parameters(), o);
  }
  AdamWOptions o;
  o.lr = 0.01;
  o.weight_decay = 0.05;
  o.no_decay_bn_bias = true;  // two groups with different weight decay, cut by the shards
  return std::make_unique<AdamW>(m.named_parameters(), o);
}

struct RunSetup {
  int stage = 0;
  Opt opt = Opt::sgd;
  double clip = 0.3;  // small enough to engage
};

// The largest of one integer over all ranks: the loss scaler's agreement, as in the training loop.
std::function<bool(bool)> agree_on(Comm& comm) {
  return [&comm](bool finite) {
    Tensor v = Tensor::from_vector<int64_t>({finite ? 0 : 1}, {1});
    comm.all_reduce(v, ReduceOp::max);
    return v.item() == 0;
  };
}

// Steps [from, to) of the training loop's sequence with 2 micro-batches of accumulation, an fp16-style
// loss scaler (scale 1024) and clipping: stage 0 through the GradientReducer and the plain optimizer,
// stages 1 and 2 through the ZeroOptimizer (stage 2: its own reducer reduces during backward, and the
// scaler checks the reduced shard).
void train(Mlp& model, Optimizer& opt, std::shared_ptr<Comm> comm, const RunSetup& s, int from, int to) {
  const int rank = comm->rank();
  GradientReducer plain(s.stage == 0 ? comm : std::make_shared<SingleProcessComm>(),
                        model.named_parameters());
  auto* zero = dynamic_cast<ZeroOptimizer*>(&opt);
  GradientReducer& reducer = zero && zero->gradient_reducer() ? *zero->gradient_reducer() : plain;
  LossScalerOptions lo;
  lo.init_scale = 1024;
  LossScaler scaler(lo);
  const std::vector<Variable> params = model.parameters();
  for (int step = from; step < to; ++step) {
    for (int micro = 0; micro < 2; ++micro) {
      reducer.set_sync(micro == 1);
      Variable loss = F::mul(F::mean(F::square(model(Variable(data(rank, step, micro))))), 0.5);
      scaler.scale_loss(loss).backward();
    }
    reducer.finish();
    const bool finite = zero ? scaler.unscale_and_check(zero->gradients_to_unscale(), agree_on(*comm))
                             : scaler.unscale_and_check(params, agree_on(*comm));
    if (!finite) throw std::runtime_error("unexpected inf");
    if (s.stage == 0 && s.clip > 0) clip_grad_norm(params, s.clip);
    opt.step();
    opt.zero_grad();
  }
}

// Stage 2 with buckets small enough that the Mlp's 4 parameters make 4 buckets, each cut by the shards.
ZeroOptions zero_options(Module& model, int stage, double clip) {
  ZeroOptions o{stage, clip};
  for (const NamedParameter& p : model.named_parameters()) o.registration_order.push_back(p.name);
  o.buckets.first_bucket_cap_bytes = 40;
  o.buckets.bucket_cap_bytes = 100;
  return o;
}

std::unique_ptr<Optimizer> make(Mlp& model, std::shared_ptr<Comm> comm, const RunSetup& s) {
  std::unique_ptr<Optimizer> opt = make_optimizer(model, s.opt);
  if (s.stage == 0) return opt;
  return std::make_unique<ZeroOptimizer>(comm, std::move(opt), zero_options(model, s.stage, s.clip));
}

std::vector<std::vector<float>> weights(const Mlp& m) {
  std::vector<std::vector<float>> out;
  for (const Variable& p : m.parameters()) out.push_back(p.data().to_vector<float>());
  return out;
}

// max |a - b| / max |b| over each tensor.
double worst_relative_difference(const std::vector<std::vector<float>>& a,
                                 const std::vector<std::vector<float>>& b) {
  double worst = 0;
  for (size_t t = 0; t < a.size(); ++t) {
    double diff = 0, scale = 1e-30;
    for (size_t i = 0; i < a[t].size(); ++i) {
      diff = std::max(diff, std::abs(static_cast<double>(a[t][i]) - b[t][i]));
      scale = std::max(scale, std::abs(static_cast<double>(b[t][i])));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

// Thread ranks, each with its CpuComm; body(rank, comm) runs on every rank.
void with_world(int world, const std::function<void(int, std::shared_ptr<Comm>)>& body) {
  ThreadWorld w(world);
  const auto errors = run_threads(world, [&](int rank) {
    auto store = w.client();
    std::shared_ptr<CpuComm> comm = w.comm(*store, rank, 20s);
    body(rank, comm);
    comm->shutdown();
  });
  for (size_t r = 0; r < errors.size(); ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
}

class ZeroMatchesStageZero : public ::testing::TestWithParam<std::tuple<int, Opt>> {};

// Acceptance: parameters after 20 steps with stages 1 and 2 equal stage 0's (relative difference
// < 1e-6), with accumulation, the loss scaler and clipping; every rank holds the same parameters.
TEST_P(ZeroMatchesStageZero, ParametersAfterTwentySteps) {
  const int world = std::get<0>(GetParam());
  const Opt opt = std::get<1>(GetParam());
  std::vector<std::vector<std::vector<std::vector<float>>>> result(
      world, std::vector<std::vector<std::vector<float>>>(3));
  with_world(world, [&](int rank, std::shared_ptr<Comm> comm) {
    for (int stage = 0; stage <= 2; ++stage) {
      Mlp model;
      const RunSetup s{stage, opt};
      auto optimizer = make(model, comm, s);
      train(model, *optimizer, comm, s, 0, 20);
      result[rank][stage] = weights(model);
    }
  });
  for (int rank = 0; rank < world; ++rank) {
    for (int stage = 1; stage <= 2; ++stage) {
      EXPECT_LT(worst_relative_difference(result[rank][stage], result[rank][0]), 1e-6)
          << "stage " << stage << " rank " << rank;
      EXPECT_EQ(result[rank][stage], result[0][stage])
          << "stage " << stage << ": rank " << rank << " differs";
    }
    // The run must have moved the weights, or the comparison proves nothing.
    Mlp initial;
    EXPECT_GT(worst_relative_difference(result[rank][0], weights(initial)), 1e-2);
  }
}

INSTANTIATE_TEST_SUITE_P(TwoAndThreeRanks, ZeroMatchesStageZero,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Values(Opt::sgd, Opt::adamw)),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                  (std::get<1>(info.param) == Opt::sgd ? "sgd" : "adamw");
                         });

// Acceptance: the optimizer state per rank is 1/N of stage 0's (to the padding of at most N-1
// elements), for AdamW's two moments and SGD's momentum buffer.
TEST(ZeroOptimizer, OptimizerStatePerRankIsOneNth) {
  for (int world : {2, 3}) {
    for (Opt opt : {Opt::sgd, Opt::adamw}) {
      const int64_t slots = opt == Opt::adamw ? 2 : 1;
      with_world(world, [&, opt](int rank, std::shared_ptr<Comm> comm) {
        Mlp full_model, sharded_model;
        const RunSetup stage0{0, opt}, stage1{1, opt};
        auto full = make(full_model, comm, stage0);
        auto sharded = make(sharded_model, comm, stage1);
        auto& zero = dynamic_cast<ZeroOptimizer&>(*sharded);
        train(full_model, *full, comm, stage0, 0, 1);
        train(sharded_model, *sharded, comm, stage1, 0, 1);
        int64_t full_bytes = 0;
        for (const auto& [name, t] : full->state_tensors())
          if (name.rfind("step.", 0) != 0) full_bytes += static_cast<int64_t>(t.nbytes());
        EXPECT_EQ(full_bytes, slots * kElements * 4);
        const int64_t shard = (kElements + world - 1) / world;
        EXPECT_EQ(zero.shard_numel(), shard);
        EXPECT_EQ(zero.local_state_bytes(), slots * shard * 4) << "rank " << rank;
        EXPECT_LE(zero.local_state_bytes() * world - full_bytes, slots * 4 * (world - 1));
      });
    }
  }
}

// The same, measured by the CPU allocator of each rank's own process: what constructing the
// ZeroOptimizer allocates (its state, eagerly) is what it reports, 1/N of a replicated optimizer's.
TEST(ZeroOptimizerProcesses, AllocatorMeasuresOneNthOfTheState) {
  for (int world : {2, 3}) {
    const int port = free_port();
    const auto out = run_processes(world, [&](int rank) {
      Rank me(rank, world, port, 10s);
      Mlp model;
      auto plain = make_optimizer(model, Opt::adamw);
      const int64_t before = cpu_memory_stats().allocated_bytes;
      ZeroOptimizer zero(me.comm, std::move(plain), ZeroOptions{1, 0.0});
      const int64_t measured = cpu_memory_stats().allocated_bytes - before;
      const int64_t shard_bytes = 2 * ((kElements + world - 1) / world) * 4;
      // The allocator rounds each of the 2 moment tensors up to 64 bytes.
      if (zero.local_state_bytes() != shard_bytes || measured < shard_bytes ||
          measured >= shard_bytes + 2 * 64)
        throw std::runtime_error("rank " + std::to_string(rank) + ": allocated " + std::to_string(measured) +
                                 " bytes, reports " + std::to_string(zero.local_state_bytes()) +
                                 ", expected " + std::to_string(shard_bytes) +
                                 " (replicated: " + std::to_string(2 * kElements * 4) + ")");
      me.comm->shutdown();
    });
    for (const auto& o : out) EXPECT_TRUE(o.ok()) << all_errors(out);
  }
}

class ZeroResume : public ::testing::TestWithParam<std::tuple<int, int, Opt>> {};

// Acceptance: 10 steps, a checkpoint of the sharded state (gathered on rank 0, written to a file by
// rank 0 alone), 10 more steps, equals bit for bit a fresh model and optimizer that load the file and
// run the same 10 steps.
TEST_P(ZeroResume, FromAGatheredCheckpointIsBitExact) {
  const int world = std::get<0>(GetParam()), stage = std::get<1>(GetParam());
  const Opt opt = std::get<2>(GetParam());
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("zero_resume_" + std::to_string(::getpid()) + "_" + std::to_string(world) + "_" +
                             std::to_string(stage) + ".safetensors"))
                               .string();
  std::vector<std::vector<std::vector<float>>> straight(world), resumed(world);
  with_world(world, [&](int rank, std::shared_ptr<Comm> comm) {
    const RunSetup s{stage, opt};
    Mlp model;
    auto optimizer = make(model, comm, s);
    train(model, *optimizer, comm, s, 0, 10);
    const std::vector<std::vector<float>> at_checkpoint = weights(model);
    dynamic_cast<ZeroOptimizer&>(*optimizer).gather_state();
    if (rank == 0) {
      auto state = optimizer->state_tensors();
      state.emplace_back("optimizer_steps",
                         Tensor::scalar(static_cast<double>(optimizer->step_count()), DType::i64));
      save_safetensors(path, state);
    }
    comm->barrier();
    // Ranks other than 0 have no full state to give.
    if (rank != 0) {
      EXPECT_THROW(optimizer->state_tensors(), std::logic_error);
    }
    train(model, *optimizer, comm, s, 10, 20);
    straight[rank] = weights(model);

    Mlp fresh;
    std::vector<Variable> params = fresh.parameters();
    for (size_t p = 0; p < params.size(); ++p)
      params[p].data().copy_(Tensor::from_vector(at_checkpoint[p], params[p].shape()));
    auto reloaded = make(fresh, comm, s);
    std::map<std::string, Tensor> file = load_safetensors(path);
    const int64_t steps = static_cast<int64_t>(file.at("optimizer_steps").item());
    file.erase("optimizer_steps");
    reloaded->load_state({file.begin(), file.end()}, steps);
    EXPECT_EQ(reloaded->step_count(), 10);
    train(fresh, *reloaded, comm, s, 10, 20);
    resumed[rank] = weights(fresh);
  });
  std::filesystem::remove(path);
  for (int rank = 0; rank < world; ++rank) EXPECT_EQ(resumed[rank], straight[rank]) << "rank " << rank;
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroResume,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Values(1, 2),
                                            ::testing::Values(Opt::sgd, Opt::adamw)),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks_stage" +
                                  std::to_string(std::get<1>(info.param)) + "_" +
                                  (std::get<2>(info.param) == Opt::sgd ? "sgd" : "adamw");
                         });

// The checkpoint of a sharded run is an ordinary one: the same names and values as stage 0's.
TEST(ZeroOptimizer, CheckpointHasTheWrappedOptimizersFormat) {
  with_world(2, [](int rank, std::shared_ptr<Comm> comm) {
    Mlp a, b;
    const RunSetup s0{0, Opt::adamw}, s1{1, Opt::adamw};
    auto plain = make(a, comm, s0);
    auto zero = make(b, comm, s1);
    train(a, *plain, comm, s0, 0, 3);
    train(b, *zero, comm, s1, 0, 3);
    dynamic_cast<ZeroOptimizer&>(*zero).gather_state();
    if (rank != 0) return;
    const auto want = plain->state_tensors(), got = zero->state_tensors();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].first, want[i].first);
      EXPECT_EQ(got[i].second.shape(), want[i].second.shape()) << got[i].first;
      const auto x = got[i].second.to_vector<double>(), y = want[i].second.to_vector<double>();
      for (size_t k = 0; k < x.size(); ++k)
        EXPECT_NEAR(x[k], y[k], 1e-6 * (1 + std::abs(y[k]))) << got[i].first;
    }
  });
}

TEST(ZeroOptimizer, AParameterWithoutGradientIsNamedOnEveryRank) {
  ThreadWorld w(2);
  const auto errors = run_threads(2, [&](int rank) {
    auto store = w.client();
    std::shared_ptr<CpuComm> comm = w.comm(*store, rank, 5s);
    Mlp model;
    ZeroOptimizer zero(comm, make_optimizer(model, Opt::sgd), ZeroOptions{2, 0.0});
    // Only fc2 takes part: fc1 gets no gradient.
    F::sum(model.fc2->forward(Variable(Tensor::ones({1, 8})))).backward();
    zero.step();
  });
  for (const auto& e : errors) EXPECT_NE(e.find("'fc1.weight' has no gradient"), std::string::npos) << e;
}

// With find_unused_parameters, stage 2 reduces zeros for a parameter no rank used (as DDP does), so
// the step goes on; SGD without momentum or weight decay then leaves that parameter as it was.
TEST(ZeroOptimizer, Stage2FindUnusedParametersReducesZeros) {
  with_world(2, [](int rank, std::shared_ptr<Comm> comm) {
    Mlp model;
    SgdOptions so;
    so.lr = 0.1;
    ZeroOptions zo = zero_options(model, 2, 0.0);
    zo.buckets.find_unused_parameters = true;
    ZeroOptimizer zero(comm, std::make_unique<Sgd>(model.named_parameters(), so), zo);
    const std::vector<float> fc1_before = model.fc1->weight().data().to_vector<float>();
    const std::vector<float> fc2_before = model.fc2->weight().data().to_vector<float>();
    F::sum(model.fc2->forward(Variable(Tensor::full({2, 8}, 0.5 + rank)))).backward();  // fc1 unused
    zero.gradient_reducer()->finish();
    zero.step();
    for (const Variable& p : model.parameters()) EXPECT_FALSE(p.grad().defined());
    EXPECT_EQ(model.fc1->weight().data().to_vector<float>(), fc1_before);
    EXPECT_NE(model.fc2->weight().data().to_vector<float>(), fc2_before);
  });
}

// Stage 2 with the loss scaler: an overflowing step is skipped on every rank (the verdict on the shard is
// agreed), and zero_grad() leaves nothing of it in the gradient shard: skip + clean step equals the clean
// step alone, bit for bit.
TEST(ZeroOptimizer, Stage2SkippedStepLeavesNothingInTheShard) {
  with_world(2, [](int rank, std::shared_ptr<Comm> comm) {
    auto run = [&](bool overflow_first) {
      Mlp model;
      auto zero = make(model, comm, RunSetup{2, Opt::adamw});
      auto& z = dynamic_cast<ZeroOptimizer&>(*zero);
      GradientReducer& reducer = *z.gradient_reducer();
      for (int step = overflow_first ? 0 : 1; step < 2; ++step) {
        LossScalerOptions lo;
        lo.init_scale = 1024;
        LossScaler scaler(lo);
        reducer.set_sync(true);
        Variable loss = F::mean(F::square(model(Variable(data(rank, 0, 0)))));
        // x 1e38 x 1024 overflows fp32: infinite gradients on step 0.
        scaler.scale_loss(step == 0 ? F::mul(loss, 1e38) : loss).backward();
        reducer.finish();
        const bool finite = scaler.unscale_and_check(z.gradients_to_unscale(), agree_on(*comm));
        EXPECT_EQ(finite, step == 1) << "step " << step;
        if (finite) zero->step();
        zero->zero_grad();
      }
      return weights(model);
    };
    EXPECT_EQ(run(true), run(false));
  });
}

// Layer-wise LR decay reaches the shards: each parameter's piece steps at its group's LR (fc1 at half
// the head's), so one rank's ZeRO step equals the plain optimizer's; LAMB and LARS, which need whole
// norms, are refused.
TEST(ZeroOptimizer, ShardsHonourLayerDecayAndRefuseLambAndLars) {
  for (int stage : {1, 2}) {
    Mlp plain_model, zero_model;
    SgdOptions o;
    o.lr = 0.05;
    o.momentum = 0.9;
    o.layer_decay = 0.5;
    Sgd plain(plain_model.named_parameters(), o);
    ZeroOptimizer zero(std::make_shared<SingleProcessComm>(),
                       std::make_unique<Sgd>(zero_model.named_parameters(), o),
                       zero_options(zero_model, stage, 0.0));
    for (int step = 0; step < 3; ++step) {
      for (Module* m : {static_cast<Module*>(&plain_model), static_cast<Module*>(&zero_model)})
        F::sum(m->forward(Variable(data(0, step, 0)))).backward();
      plain.step();
      zero.step();
      plain.zero_grad();
      zero.zero_grad();
    }
    EXPECT_EQ(weights(plain_model), weights(zero_model)) << "stage " << stage;
  }
  Mlp model;
  EXPECT_THROW(
      ZeroOptimizer(std::make_shared<SingleProcessComm>(),
                    std::make_unique<Lamb>(model.named_parameters(), LambOptions{}), ZeroOptions{1, 0.0}),
      std::invalid_argument);
  EXPECT_THROW(
      ZeroOptimizer(std::make_shared<SingleProcessComm>(),
                    std::make_unique<Lars>(model.named_parameters(), LarsOptions{}), ZeroOptions{1, 0.0}),
      std::invalid_argument);
}

TEST(ZeroOptimizer, RejectsUnsupportedStages) {
  Mlp model;
  EXPECT_THROW(ZeroOptimizer(std::make_shared<SingleProcessComm>(), make_optimizer(model, Opt::sgd),
                             ZeroOptions{3, 0.0}),
               std::invalid_argument);
}

}  // namespace
}  // namespace trainer
