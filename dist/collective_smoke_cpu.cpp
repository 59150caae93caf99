#include <chrono>
#include <cmath>
#include <exception>
#include <memory>
#include <string>
#include <thread>

#include "dist/collective_smoke.h"
#include "dist/cpu_comm.h"
#include "dist/store.h"
#include "nn/tensor.h"

namespace trainer {
namespace {

using Clock = std::chrono::steady_clock;

struct RankOutcome {
  std::string error;
  std::vector<CollectiveTiming> timings;
};

// Throws naming the first element of `t` that differs from the expected sum.
void check_sum(const Tensor& t, int rank, int ranks, const char* after, float tolerance) {
  const float* v = t.data<float>();
  for (size_t i = 0; i < static_cast<size_t>(t.numel()); ++i)
    if (!smoke_matches(v[i], i, ranks, tolerance))
      throw std::runtime_error("rank " + std::to_string(rank) + ": element " + std::to_string(i) + " is " +
                               std::to_string(v[i]) + " after " + after + ", expected " +
                               std::to_string(smoke_expected_sum(i, ranks)));
}

void run_rank(int rank, int ranks, int port, const std::vector<size_t>& sizes, int iterations,
              std::chrono::milliseconds timeout, RankOutcome& out) {
  std::shared_ptr<CpuComm> comm;
  try {
    TcpStoreOptions so;
    so.port = port;
    so.connect_timeout = timeout;
    so.reply_timeout = timeout;
    TcpStore store(so);
    CpuCommOptions co;
    co.name = "doctor";
    co.timeout = timeout;
    co.connect_timeout = timeout;
    comm = CpuComm::create(store, rank, ranks, co);
    for (size_t bytes : sizes) {
      const size_t count = bytes / sizeof(float);
      Tensor t = Tensor::empty({static_cast<int64_t>(count)});
      float* v = t.data<float>();
      for (size_t i = 0; i < count; ++i) v[i] = smoke_fill_value(i, rank);
      comm->all_reduce(t, ReduceOp::sum);
      check_sum(t, rank, ranks, "sum", 0.0f);
      comm->all_reduce(t, ReduceOp::avg);  // warm-up (buffers, first-touch pages)
      comm->barrier();                     // every rank starts the clock together
      const auto start = Clock::now();
      for (int k = 0; k < iterations; ++k) comm->all_reduce(t, ReduceOp::avg);
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count() / iterations;
      check_sum(t, rank, ranks, "average", kAverageTolerance);
      out.timings.push_back({bytes, seconds, all_reduce_bus_bandwidth(bytes, seconds, ranks)});
    }
    comm->shutdown();
  } catch (const std::exception& e) {
    out.error = e.what();
    // The other ranks are waiting in a collective: tell them now rather than at their timeout.
    if (comm) comm->abort(out.error);
  }
}

}  // namespace

double all_reduce_bus_bandwidth(size_t bytes, double seconds, int ranks) {
  if (seconds <= 0 || ranks < 2) return 0.0;
  return static_cast<double>(bytes) / seconds * 2.0 * (ranks - 1) / ranks / 1e9;
}

float smoke_fill_value(size_t i, int rank) { return static_cast<float>(rank + 1 + static_cast<int>(i % 5)); }

float smoke_expected_sum(size_t i, int ranks) {
  return static_cast<float>(ranks * (ranks + 1) / 2 + ranks * static_cast<int>(i % 5));
}

bool smoke_matches(float value, size_t i, int ranks, float tolerance) {
  const float expected = smoke_expected_sum(i, ranks);
  return tolerance == 0.0f ? value == expected : std::fabs(value - expected) <= tolerance * expected;
}

CollectiveSmoke cpu_all_reduce_smoke(int ranks, const std::vector<size_t>& sizes, int iterations,
                                     std::chrono::milliseconds timeout) {
  CollectiveSmoke result;
  result.backend = "tcp";
  result.ranks = ranks;
  std::unique_ptr<TcpStore> server;
  try {
    TcpStoreOptions so;
    so.port = 0;  // any free port: a doctor must not collide with a job on MASTER_PORT
    so.is_server = true;
    so.bind_host = "127.0.0.1";
    so.connect_timeout = timeout;
    server = std::make_unique<TcpStore>(so);
  } catch (const std::exception& e) {
    result.error = std::string("cannot serve a local store: ") + e.what();
    return result;
  }
  // Every wait inside has a deadline, so the joins below are bounded by set-up + collectives.
  std::vector<RankOutcome> outcomes(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back(run_rank, r, ranks, server->port(), std::cref(sizes), iterations, timeout,
                         std::ref(outcomes[static_cast<size_t>(r)]));
  for (std::thread& t : threads) t.join();
  for (const RankOutcome& o : outcomes)
    if (!o.error.empty() && result.error.empty()) result.error = o.error;
  result.correct = result.error.empty();
  if (result.correct) result.timings = outcomes[0].timings;  // rank 0's clock
  return result;
}

}  // namespace trainer
