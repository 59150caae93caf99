#include "dist/cpu_comm.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>

#include "dist/error.h"
#include "dist/store.h"
#include "multi_process.h"

namespace trainer {
namespace {

using namespace testing;

std::vector<float> rank_values(int rank, int64_t n) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>((rank + 1) * 0.5 + i * 0.25 - (i % 7) * rank);
  return v;
}

// Runs body(rank, comm) on `world` thread ranks; each rank's comm shuts down at the end.
std::vector<std::string> with_comms(int world, const std::function<void(int, Comm&)>& body,
                                    std::chrono::milliseconds timeout = 10s) {
  ThreadWorld w(world);
  return run_threads(world, [&](int rank) {
    auto store = w.client();
    auto comm = w.comm(*store, rank, timeout);
    body(rank, *comm);
    comm->shutdown();
  });
}

void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

class AllReduce : public ::testing::TestWithParam<std::tuple<int, int64_t>> {};

TEST_P(AllReduce, SumAvgMaxMatchTheHandComputedResultOnEveryRank) {
  const auto [world, n] = GetParam();  // small sizes take the flat path, large ones the ring
  std::vector<std::vector<float>> sums(world), avgs(world), maxs(world);
  expect_no_errors(with_comms(world, [&, n = n](int rank, Comm& comm) {
    Tensor s = Tensor::from_vector(rank_values(rank, n), {n});
    Tensor a = s.clone(), m = s.clone();
    comm.all_reduce(s, ReduceOp::sum);
    auto work = comm.all_reduce_async(a, ReduceOp::avg);  // two in flight
    comm.all_reduce(m, ReduceOp::max);
    work->wait();
    EXPECT_TRUE(work->completed());
    sums[rank] = s.to_vector<float>();
    avgs[rank] = a.to_vector<float>();
    maxs[rank] = m.to_vector<float>();
  }));
  std::vector<std::vector<float>> inputs;
  for (int r = 0; r < world; ++r) inputs.push_back(rank_values(r, n));
  for (int64_t i = 0; i < n; ++i) {
    double sum = 0, mx = -1e30;
    for (int r = 0; r < world; ++r) {
      sum += inputs[r][i];
      mx = std::max<double>(mx, inputs[r][i]);
    }
    ASSERT_NEAR(sums[0][i], sum, 1e-4 * (1 + std::abs(sum))) << i;
    ASSERT_NEAR(avgs[0][i], sum / world, 1e-4 * (1 + std::abs(sum))) << i;
    ASSERT_EQ(maxs[0][i], static_cast<float>(mx)) << i;
  }
  for (int r = 1; r < world; ++r) {  // bitwise identical everywhere
    EXPECT_EQ(std::memcmp(sums[r].data(), sums[0].data(), n * sizeof(float)), 0) << r;
    EXPECT_EQ(std::memcmp(avgs[r].data(), avgs[0].data(), n * sizeof(float)), 0) << r;
    EXPECT_EQ(maxs[r], maxs[0]);
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, AllReduce,
                         ::testing::Values(std::make_tuple(2, int64_t{5}),
                                           std::make_tuple(2, int64_t{100003}),
                                           std::make_tuple(3, int64_t{1}), std::make_tuple(3, int64_t{7}),
                                           std::make_tuple(3, int64_t{100003}),
                                           std::make_tuple(4, int64_t{65537})));

TEST(CpuComm, AllReduceOtherDtypesAndLayouts) {
  expect_no_errors(with_comms(3, [](int rank, Comm& comm) {
    Tensor d = Tensor::from_vector<double>({1.0 * rank, 0.1}, {2});
    comm.all_reduce(d, ReduceOp::sum);
    EXPECT_EQ(d.to_vector<double>(), (std::vector<double>{3.0, 0.1 + 0.1 + 0.1}));
    Tensor i = Tensor::from_vector<int64_t>({rank, 10 - rank}, {2});
    comm.all_reduce(i, ReduceOp::max);
    EXPECT_EQ(i.data<int64_t>()[0], 2);
    EXPECT_EQ(i.data<int64_t>()[1], 10);
    // A non-contiguous view is reduced in place through a staging copy.
    Tensor m = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
    Tensor t = m.permute({1, 0});
    comm.all_reduce(t, ReduceOp::sum);
    EXPECT_EQ(m.to_vector<float>(), (std::vector<float>{3, 6, 9, 12, 15, 18}));
    EXPECT_THROW(comm.all_reduce(i, ReduceOp::avg), DistError);  // rejected before anything is sent
  }));
}

// Every rank keeps chunk `rank` of the reduction: the ZeRO optimizer's gradient shards.
TEST(CpuComm, ReduceScatterLeavesEachRankItsChunkOfTheReduction) {
  for (int world : {1, 2, 3, 4}) {
    const int64_t k = 1001;
    expect_no_errors(with_comms(world, [&](int rank, Comm& comm) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
        Tensor input = Tensor::from_vector(rank_values(rank, world * k), {world * k});
        Tensor output = Tensor::zeros({k});
        comm.reduce_scatter(input, output, op);
        const std::vector<float> got = output.to_vector<float>();
        for (int64_t i = 0; i < k; ++i) {
          double want = op == ReduceOp::max ? -1e30 : 0.0;
          for (int r = 0; r < world; ++r) {
            const double v = rank_values(r, world * k)[rank * k + i];
            want = op == ReduceOp::max ? std::max(want, v) : want + v;
          }
          if (op == ReduceOp::avg) want /= world;
          ASSERT_NEAR(got[i], want, 1e-4 * (1 + std::abs(want)))
              << "world " << world << " rank " << rank << " " << reduce_op_name(op) << " element " << i;
        }
      }
    }));
  }
}

TEST(CpuComm, ReduceScatterChecksShapesAndNamesMismatches) {
  expect_no_errors(with_comms(2, [](int, Comm& comm) {
    Tensor input = Tensor::zeros({7}), output = Tensor::zeros({3});
    EXPECT_THROW(comm.reduce_scatter(input, output, ReduceOp::sum), DistError);  // 7 != 2 x 3, nothing sent
  }));
  const std::vector<std::string> errors = with_comms(
      2,
      [](int rank, Comm& comm) {
        Tensor input = Tensor::zeros({rank == 0 ? 8 : 6}), output = Tensor::zeros({rank == 0 ? 4 : 3});
        comm.reduce_scatter(input, output, ReduceOp::avg);
      },
      5s);
  bool seen = false;
  for (const auto& e : errors) {
    EXPECT_NE(e, "");
    seen = seen || e.find("tensor mismatch in reduce_scatter #0 (32 B of f32, avg)") != std::string::npos;
  }
  EXPECT_TRUE(seen) << errors[0] << "\n" << errors[1];
}

// A stop signal at start-up ends the communicator's set-up too: rank 0 waiting for a higher rank that
// published its address and then never connected (here a made-up address) stops within a second.
TEST(CpuComm, AStopSignalEndsTheSetUpWait) {
  TcpStore store(store_options(0, true));
  store.set("comm/default/addr/1", "127.0.0.1 1");  // rank 1 "arrived", but will never connect
  CpuCommOptions o;
  o.listen_address = "127.0.0.1";
  o.connect_timeout = 60s;  // the test fails, not hangs, if the signal is not seen
  Caught stopped;
  {
    StopSignalAfter stop(300ms);
    stopped = stop_of([&] { CpuComm::create(store, 0, 2, o); });
  }
  EXPECT_EQ(stopped.signal, SIGTERM) << stopped.message;
  EXPECT_NE(stopped.message.find("waiting for the higher ranks to connect"), std::string::npos)
      << stopped.message;
}

TEST(CpuComm, Broadcast) {
  expect_no_errors(with_comms(3, [](int rank, Comm& comm) {
    Tensor t = Tensor::full({3, 40000}, rank == 1 ? 7.0 : -1.0);
    comm.broadcast(t, 1);
    const std::vector<float> v = t.to_vector<float>();
    EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float x) { return x == 7.0f; }));
  }));
}

TEST(CpuComm, AllGatherWithUnevenSizes) {
  // Evaluation's last batches differ per rank: nothing may be padded, truncated or misaligned.
  const int64_t rows[3] = {2, 0, 5};
  expect_no_errors(with_comms(3, [&](int rank, Comm& comm) {
    std::vector<float> mine;
    for (int64_t i = 0; i < rows[rank] * 3; ++i) mine.push_back(rank * 100.0f + i);
    const Tensor t = Tensor::from_vector(mine, {rows[rank], 3});
    const std::vector<Tensor> all = comm.all_gather(t);
    ASSERT_EQ(all.size(), 3u);
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(all[r].shape(), (Shape{rows[r], 3}));
      const std::vector<float> v = all[r].to_vector<float>();
      for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i], r * 100.0f + i);
    }
    const Tensor cat = comm.all_gather_cat(t);
    EXPECT_EQ(cat.shape(), (Shape{7, 3}));
    EXPECT_EQ(cat.to_vector<float>()[6], 100.0f * 2);  // row 2 = rank 2's first row
    // Scalars gather too.
    const std::vector<Tensor> s = comm.all_gather(Tensor::scalar(rank, DType::i64));
    EXPECT_EQ(s[2].data<int64_t>()[0], 2);
  }));
}

TEST(CpuComm, AllGatherRejectsDifferentTrailingDims) {
  const std::vector<std::string> errors = with_comms(2, [](int rank, Comm& comm) {
    try {
      comm.all_gather(Tensor::zeros({2, rank == 0 ? 10 : 12}));
    } catch (const DistError&) {
      comm.shutdown();  // already failed: closes without a word
      throw;
    }
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("rank 0: [2, 10] f32, rank 1: [2, 12] f32"), std::string::npos) << e;
    EXPECT_NE(e.find("only dim 0"), std::string::npos) << e;
  }
}

TEST(CpuComm, BarrierTimeoutNamesTheRankThatDidNotArrive) {
  ThreadWorld w(3);
  std::atomic<int> timed_out{0};
  std::vector<double> took(3);
  const std::vector<std::string> errors = run_threads(3, [&](int rank) {
    auto store = w.client();
    auto comm = w.comm(*store, rank, 1s);
    if (rank == 2) {  // alive, but busy elsewhere until both others gave up
      while (timed_out < 2) std::this_thread::sleep_for(10ms);
      return;
    }
    const auto start = Clock::now();
    try {
      comm->barrier();
    } catch (...) {
      took[rank] = seconds_since(start);
      ++timed_out;
      throw;
    }
  });
  for (int r = 0; r < 2; ++r) {
    // Its own timeout, or the first one's, relayed at once.
    EXPECT_NE(errors[r].find("barrier #0 timed out after 1 s on rank "), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find(": rank(s) 2 did not arrive"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("HINT"), std::string::npos);
    EXPECT_GE(took[r], 0.9);
    EXPECT_LT(took[r], 3.0);
  }
}

TEST(CpuComm, DifferentCollectivesAreReportedNotHung) {
  const std::vector<std::string> errors = with_comms(
      2,
      [](int rank, Comm& comm) {
        Tensor t = Tensor::zeros({4});
        if (rank == 0)
          comm.all_reduce(t, ReduceOp::sum);
        else
          comm.broadcast(t, 0);
      },
      5s);
  bool seen = false;
  for (const auto& e : errors) seen = seen || e.find("collective mismatch") != std::string::npos;
  EXPECT_TRUE(seen) << errors[0] << "\n" << errors[1];
  for (const auto& e : errors) EXPECT_NE(e, "");
}

TEST(CpuComm, DifferentSizesAreReported) {
  const std::vector<std::string> errors = with_comms(3, [](int rank, Comm& comm) {
    Tensor t = Tensor::zeros({rank == 1 ? 5 : 4});
    comm.all_reduce(t, ReduceOp::sum);
  });
  bool seen = false;
  for (const auto& e : errors) {
    EXPECT_NE(e, "");
    seen = seen || e.find("tensor mismatch in all_reduce #0 (16 B of f32, sum): rank 1 has 20 B of f32") !=
                       std::string::npos;
  }
  EXPECT_TRUE(seen) << errors[0] << "\n" << errors[1] << "\n" << errors[2];
}

TEST(CpuComm, AbortReachesThePeersAtOnce) {
  ThreadWorld w(3);
  std::vector<double> took(3);
  const std::vector<std::string> errors = run_threads(3, [&](int rank) {
    auto store = w.client();
    auto comm = w.comm(*store, rank, 20s);
    const auto start = Clock::now();
    if (rank == 1) {
      std::this_thread::sleep_for(200ms);
      comm->abort("rank 1 found an unused parameter 'fc.weight'");
      throw DistError("aborted");
    }
    try {
      Tensor t = Tensor::zeros({100000});
      comm->all_reduce(t, ReduceOp::sum);
    } catch (...) {
      took[rank] = seconds_since(start);
      throw;
    }
  });
  for (int r : {0, 2}) {
    EXPECT_NE(errors[r].find("rank 1 failed: rank 1 found an unused parameter 'fc.weight'"),
              std::string::npos)
        << errors[r];
    EXPECT_LT(took[r], 3.0);  // not the 20 s timeout
  }
}

// ---- real processes: a rank that dies

void expect_peers_fail_fast(const std::vector<RankOutcome>& out, int dead, const std::string& needle) {
  for (int r = 0; r < static_cast<int>(out.size()); ++r) {
    if (r == dead) continue;
    EXPECT_EQ(out[r].exit_code, 1) << all_errors(out);
    EXPECT_NE(out[r].error.find(needle), std::string::npos) << all_errors(out);
    EXPECT_LT(out[r].seconds, 4.0) << all_errors(out);  // well before the test's limit; timeout is 2 s
  }
}

TEST(CpuCommProcesses, KilledRankMakesTheOthersFailNotHang) {
  const int port = free_port();
  const auto out = run_processes(3, [&](int rank) {
    Rank me(rank, 3, port, 2s);
    Tensor t = Tensor::ones({1000});
    me.comm->all_reduce(t, ReduceOp::sum);
    if (t.to_vector<float>()[0] != 3.0f) throw std::runtime_error("wrong sum");
    if (rank == 1) ::kill(::getpid(), SIGKILL);  // no destructor, no goodbye
    me.comm->all_reduce(t, ReduceOp::sum);
    me.comm->shutdown();
  });
  EXPECT_EQ(out[1].signal, SIGKILL);
  expect_peers_fail_fast(out, 1, "rank 1 closed its connection");
}

TEST(CpuCommProcesses, RankExitingMidRingAllReduce) {
  const int port = free_port();
  const auto out = run_processes(3, [&](int rank) {
    Rank me(rank, 3, port, 2s);
    Tensor t = Tensor::ones({4 << 20});  // 16 MiB: a ring that takes a while
    auto work = me.comm->all_reduce_async(t, ReduceOp::sum);
    if (rank == 2) {
      std::this_thread::sleep_for(5ms);
      ::_exit(3);  // mid-collective, sockets closed by the kernel
    }
    work->wait();
    me.comm->shutdown();
  });
  EXPECT_EQ(out[2].exit_code, 3);
  for (int r : {0, 1}) {
    EXPECT_EQ(out[r].exit_code, 1) << all_errors(out);
    EXPECT_NE(out[r].error.find("all_reduce #0"), std::string::npos) << all_errors(out);
    EXPECT_NE(out[r].error.find("rank 2"), std::string::npos) << all_errors(out);
    EXPECT_LT(out[r].seconds, 4.0) << all_errors(out);
  }
}

TEST(CpuCommProcesses, RankThatLeavesWithoutShutdownIsReported) {
  const int port = free_port();
  const auto out = run_processes(2, [&](int rank) {
    Rank me(rank, 2, port, 2s);
    if (rank == 0) return;  // destroys its communicator: the peer hears why
    me.comm->barrier();
  });
  EXPECT_TRUE(out[0].ok()) << all_errors(out);
  EXPECT_NE(out[1].error.find("without shutdown()"), std::string::npos) << all_errors(out);
  EXPECT_LT(out[1].seconds, 4.0);
}

TEST(CpuCommProcesses, OrderlyShutdownAfterTheLastCollective) {
  // Ranks finish at different times; none may see an early exit of another as a failure.
  const int port = free_port();
  const auto out = run_processes(3, [&](int rank) {
    Rank me(rank, 3, port, 5s);
    for (int i = 0; i < 20; ++i) {
      Tensor t = Tensor::full({50000}, i);
      me.comm->all_reduce(t, ReduceOp::avg);
    }
    if (rank == 1) std::this_thread::sleep_for(300ms);
    me.comm->shutdown();
    bool threw = false;
    try {
      me.comm->barrier();  // after shutdown
    } catch (const DistError&) {
      threw = true;
    }
    if (!threw) throw std::runtime_error("a collective after shutdown() did not throw");
  });
  for (const auto& o : out) EXPECT_TRUE(o.ok()) << all_errors(out);
}

}  // namespace
}  // namespace trainer
