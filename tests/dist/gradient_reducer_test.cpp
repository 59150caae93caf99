#include "dist/gradient_reducer.h"

#include <gtest/gtest.h>

#include <cmath>

#include "dist/error.h"
#include "multi_process.h"
#include "nn/functional.h"

namespace trainer {
namespace {

using namespace testing;

// A two-layer net built from raw parameters, plus one parameter that only some forwards use.
struct Net {
  Variable w1, b1, w2, b2, extra;
  std::vector<NamedParameter> params() const {
    return {{"fc1.weight", w1}, {"fc1.bias", b1}, {"fc2.weight", w2}, {"fc2.bias", b2}, {"extra", extra}};
  }
};

std::vector<float> pattern(int64_t n, float scale, float shift) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = scale * std::sin(0.7f * i + shift);
  return v;
}

Net make_net(float shift = 0.0f) {
  Net n;
  n.w1 = Variable(Tensor::from_vector(pattern(20, 0.5f, shift), {5, 4}), true);
  n.b1 = Variable(Tensor::from_vector(pattern(4, 0.1f, shift + 1), {4}), true);
  n.w2 = Variable(Tensor::from_vector(pattern(12, 0.5f, shift + 2), {4, 3}), true);
  n.b2 = Variable(Tensor::from_vector(pattern(3, 0.1f, shift + 3), {3}), true);
  n.extra = Variable(Tensor::from_vector(pattern(2, 1.0f, shift + 4), {2}), true);
  return n;
}

// Different data on every rank and micro-batch.
Tensor batch(int rank, int micro) {
  return Tensor::from_vector(pattern(15, 1.0f, 10.0f * rank + micro), {3, 5});
}

Variable loss_of(const Net& n, const Tensor& x, bool use_extra) {
  Variable h = F::relu(F::add(F::matmul(Variable(x), n.w1), n.b1));
  Variable y = F::add(F::matmul(h, n.w2), n.b2);
  Variable loss = F::mean(F::square(y));
  if (use_extra) loss = F::add(loss, F::sum(F::mul(n.extra, 1.5)));
  return loss;
}

// One rank's gradients summed over its micro-batches 0..micros-1, without any reducer.
std::vector<std::vector<float>> local_grads(int rank, int micros, bool use_extra) {
  Net n = make_net();
  for (int m = 0; m < micros; ++m) loss_of(n, batch(rank, m), use_extra).backward();
  std::vector<std::vector<float>> grads;
  for (const auto& p : n.params())
    grads.push_back(p.param.grad().defined() ? p.param.grad().to_vector<float>()
                                             : std::vector<float>(p.param.numel(), 0.0f));
  return grads;
}

// The gradients data parallelism must produce, computed by hand: every rank's local gradients,
// averaged over ranks.
std::vector<std::vector<float>> expected_grads(int world, int micros,
                                               const std::function<bool(int)>& uses_extra) {
  std::vector<std::vector<float>> mean;
  for (int r = 0; r < world; ++r) {
    const auto g = local_grads(r, micros, uses_extra(r));
    mean.resize(g.size());
    for (size_t i = 0; i < g.size(); ++i) {
      mean[i].resize(g[i].size(), 0.0f);
      for (size_t k = 0; k < g[i].size(); ++k) mean[i][k] += g[i][k] / world;
    }
  }
  return mean;
}

void check_grads(const Net& n, const std::vector<std::vector<float>>& want, const std::string& what) {
  const auto params = n.params();
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].param.grad().defined())
      throw std::runtime_error(what + ": " + params[i].name + " has no grad");
    const std::vector<float> got = params[i].param.grad().to_vector<float>();
    for (size_t k = 0; k < got.size(); ++k)
      if (std::abs(got[k] - want[i][k]) > 1e-5f * (1 + std::abs(want[i][k])))
        throw std::runtime_error(what + ": " + params[i].name + "[" + std::to_string(k) +
                                 "] = " + std::to_string(got[k]) + ", want " + std::to_string(want[i][k]));
  }
}

ReducerOptions tiny_buckets() {
  ReducerOptions o;
  o.first_bucket_cap_bytes = 16;  // fc2.bias + ... : several buckets even for this small net
  o.bucket_cap_bytes = 64;
  return o;
}

void expect_all_ok(const std::vector<RankOutcome>& out) {
  for (const auto& o : out) EXPECT_TRUE(o.ok()) << all_errors(out);
}

class ReducerRanks : public ::testing::TestWithParam<int> {};

TEST_P(ReducerRanks, AveragesGradientsOverRanksWithDifferentData) {
  const int world = GetParam();
  const int port = free_port();
  expect_all_ok(run_processes(world, [&](int rank) {
    Rank me(rank, world, port, 5s);
    Net n = make_net();
    GradientReducer reducer(me.comm, n.params(), tiny_buckets());
    if (reducer.bucket_count() < 3) throw std::runtime_error("expected several buckets");
    // Reverse registration order: the last layer's parameters are reduced first.
    if (reducer.bucket_parameter_names().front().front() != "extra") throw std::runtime_error("bucket order");
    for (int step = 0; step < 2; ++step) {  // the reducer is reusable step after step
      for (auto& p : n.params()) p.param.zero_grad();
      loss_of(n, batch(rank, 0), true).backward();
      reducer.finish();
      // Every bucket started from the hooks, during backward, not in finish().
      if (reducer.last_buckets_launched_in_backward() != reducer.bucket_count())
        throw std::runtime_error("buckets were not launched during backward");
      check_grads(n, expected_grads(world, 1, [](int) { return true; }), "step " + std::to_string(step));
    }
    me.comm->shutdown();
  }));
}

INSTANTIATE_TEST_SUITE_P(World, ReducerRanks, ::testing::Values(2, 3));

TEST(GradientReducer, NoSyncAccumulatesLocallyThenAveragesTheSum) {
  const int port = free_port();
  expect_all_ok(run_processes(2, [&](int rank) {
    Rank me(rank, 2, port, 5s);
    Net n = make_net();
    GradientReducer reducer(me.comm, n.params(), tiny_buckets());
    {
      NoSyncGuard no_sync(reducer);
      loss_of(n, batch(rank, 0), true).backward();
    }
    reducer.set_sync(false);
    loss_of(n, batch(rank, 1), true).backward();
    reducer.finish();  // no-op while sync is off
    // Still this rank's own sum: nothing was communicated.
    check_grads(n, local_grads(rank, 2, true), "after no_sync");
    reducer.set_sync(true);
    loss_of(n, batch(rank, 2), true).backward();
    reducer.finish();
    check_grads(n, expected_grads(2, 3, [](int) { return true; }), "after the synchronised micro-batch");
    me.comm->shutdown();
  }));
}

TEST(GradientReducer, UnusedParameterIsAnErrorNamingIt) {
  const int port = free_port();
  const auto out = run_processes(2, [&](int rank) {
    Rank me(rank, 2, port, 10s);
    Net n = make_net();
    GradientReducer reducer(me.comm, n.params(), tiny_buckets());
    loss_of(n, batch(rank, 0), /*use_extra=*/false).backward();
    reducer.finish();
  });
  for (const auto& o : out) {
    EXPECT_EQ(o.exit_code, 1) << all_errors(out);
    EXPECT_NE(o.error.find("1 parameter(s) received no gradient in this backward: extra."), std::string::npos)
        << all_errors(out);
    EXPECT_NE(o.error.find("find_unused_parameters"), std::string::npos) << all_errors(out);
    EXPECT_LT(o.seconds, 5.0);  // not the 10 s timeout
  }
}

TEST(GradientReducer, UnusedOnOneRankOnlyStopsTheOthersWithTheReason) {
  const int port = free_port();
  const auto out = run_processes(2, [&](int rank) {
    Rank me(rank, 2, port, 10s);
    Net n = make_net();
    GradientReducer reducer(me.comm, n.params(), tiny_buckets());
    loss_of(n, batch(rank, 0), /*use_extra=*/rank == 0).backward();
    reducer.finish();
    me.comm->shutdown();
  });
  EXPECT_NE(out[1].error.find("GradientReducer on rank 1: 1 parameter(s) received no gradient"),
            std::string::npos)
      << all_errors(out);
  // Rank 0 launched every bucket; it must not wait out the timeout for rank 1's.
  EXPECT_NE(out[0].error.find("received no gradient in this backward: extra"), std::string::npos)
      << all_errors(out);
  for (const auto& o : out) EXPECT_LT(o.seconds, 5.0) << all_errors(out);
}

TEST(GradientReducer, FindUnusedParametersReducesZeros) {
  const int port = free_port();
  expect_all_ok(run_processes(2, [&](int rank) {
    Rank me(rank, 2, port, 5s);
    Net n = make_net();
    ReducerOptions o = tiny_buckets();
    o.find_unused_parameters = true;
    GradientReducer reducer(me.comm, n.params(), o);
    loss_of(n, batch(rank, 0), /*use_extra=*/rank == 0).backward();
    reducer.finish();
    check_grads(n, expected_grads(2, 1, [](int r) { return r == 0; }), "find_unused_parameters");
    me.comm->shutdown();
  }));
}

TEST(GradientReducer, WorldSizeOneCostsNothing) {
  Net n = make_net();
  GradientReducer reducer(std::make_shared<SingleProcessComm>(), n.params());
  EXPECT_FALSE(reducer.active());
  EXPECT_EQ(reducer.bucket_count(), 0);
  loss_of(n, batch(0, 0), /*use_extra=*/false).backward();  // unused parameters are fine alone
  const Tensor before = n.w1.grad();
  reducer.finish();
  EXPECT_TRUE(n.w1.grad().same_storage(before));  // no copy in, no copy back
  EXPECT_FALSE(n.extra.grad().defined());
}

TEST(BroadcastState, RanksStartFromRootsWeightsAndBuffers) {
  ThreadWorld w(3);
  std::vector<std::vector<float>> w1(3);
  std::vector<int64_t> counter(3);
  const auto errors = run_threads(3, [&](int rank) {
    auto store = w.client();
    auto comm = w.comm(*store, rank);
    Net n = make_net(static_cast<float>(rank));  // different initialisation per rank
    Tensor running = Tensor::full({4}, rank);
    Tensor batches = Tensor::from_vector<int64_t>({100 + rank}, {1});
    std::vector<NamedTensor> state{{"fc1.weight", &n.w1.data(), false},
                                   {"fc1.bias", &n.b1.data(), false},
                                   {"bn.running_mean", &running, true},
                                   {"bn.num_batches_tracked", &batches, true}};
    broadcast_state(*comm, state, 0);
    w1[rank] = n.w1.data().to_vector<float>();
    counter[rank] = batches.data<int64_t>()[0];
    if (running.to_vector<float>() != std::vector<float>(4, 0.0f))
      throw std::runtime_error("buffer not broadcast");
    comm->shutdown();
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(w1[1], w1[0]);
  EXPECT_EQ(w1[2], w1[0]);
  EXPECT_EQ(w1[0], make_net(0).w1.data().to_vector<float>());
  EXPECT_EQ(counter, (std::vector<int64_t>{100, 100, 100}));
}

TEST(BroadcastState, DifferentModelsAreAnError) {
  ThreadWorld w(2);
  const auto errors = run_threads(2, [&](int rank) {
    auto store = w.client();
    auto comm = w.comm(*store, rank);
    Tensor a = Tensor::zeros({rank == 0 ? 4 : 5});
    broadcast_state(*comm, {{"fc.weight", &a, false}}, 0);
  });
  for (const auto& e : errors)
    EXPECT_NE(e.find("ranks disagree on the model's parameter"), std::string::npos) << e;
}

}  // namespace
}  // namespace trainer
