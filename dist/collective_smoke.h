#pragma once
// A short all-reduce across local ranks that checks the result and measures bus bandwidth: `trainer
// doctor`'s collective smoke test. Two variants with one result type:
//   - the CPU communicator (dist/cpu_comm.h) between `ranks` threads of this process, over a TCP
//     store and loopback connections: the code path of CPU data parallelism, minus process start-up;
//   - NCCL across every visible GPU from this one process (CUDA builds): one communicator per device,
//     set up in one NCCL group, so no launcher is needed.
// Neither can hang: set-up and every collective have a deadline (`timeout`); when it passes the
// communicators are aborted and the result carries an error naming the step that did not finish.
//
// Check: rank r fills element i with (r + 1) + (i % 5); a sum all-reduce must give n(n+1)/2 + n(i % 5)
// on every rank (small integers: exact in f32, so any difference is a real fault). The timed
// iterations then average that result in place, which must leave it unchanged (checked again, to
// rounding).
// Bus bandwidth as nccl-tests reports it: bytes / seconds x 2(n-1)/n, the ring's traffic per link.
#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

namespace trainer {

struct CollectiveTiming {
  size_t bytes = 0;
  double seconds = 0.0;  // mean per all-reduce
  double bus_gb_per_s = 0.0;
};

struct CollectiveSmoke {
  std::string backend;  // "tcp" or "nccl"
  int ranks = 0;
  bool correct = false;  // every rank's sum and average matched the expected values
  std::string error;     // set-up failure, timeout, or the first wrong element (rank, index, value)
  std::vector<CollectiveTiming> timings;
};

// Bus bandwidth in GB/s (1e9 bytes) of an all-reduce of `bytes` over `ranks` that took `seconds`.
double all_reduce_bus_bandwidth(size_t bytes, double seconds, int ranks);

// The fill above, and the expected element `i` after a sum over `ranks` of it.
float smoke_fill_value(size_t i, int rank);
float smoke_expected_sum(size_t i, int ranks);
// Whether `value` is the expected sum: exactly (tolerance 0) after the sum; after averaging within a
// relative tolerance, because NCCL may pre-multiply by 1/n, which is inexact for n not a power of 2.
bool smoke_matches(float value, size_t i, int ranks, float tolerance);
constexpr float kAverageTolerance = 1e-5f;

// `ranks` threads, each with its own store client and CpuComm, all-reduce f32 buffers of `sizes` bytes.
CollectiveSmoke cpu_all_reduce_smoke(int ranks, const std::vector<size_t>& sizes, int iterations,
                                     std::chrono::milliseconds timeout);

// What this machine's local ranks would use: NCCL across every visible GPU when there are 2 or more
// (CUDA builds), else the CPU communicator between 2 threads; a few sizes up to 256 MiB (NCCL) or
// 16 MiB (CPU), the largest last.
CollectiveSmoke local_all_reduce_smoke(int visible_gpus, std::chrono::milliseconds timeout);

// Every visible GPU, one NCCL communicator each, from this thread. Needs 2 or more GPUs; throws DistError
// in a build without CUDA (dist/nccl_unavailable.cpp).
CollectiveSmoke nccl_all_reduce_smoke(const std::vector<size_t>& sizes, int iterations,
                                      std::chrono::milliseconds timeout);

}  // namespace trainer
