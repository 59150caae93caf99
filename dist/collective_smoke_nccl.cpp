// NCCL half of the collective smoke test (see dist/collective_smoke.h): every visible GPU from one
// process, in NCCL's non-blocking mode so that set-up and collectives can be bounded and aborted.
// Built with the CUDA backend only (CMake leaves it out otherwise; dist/nccl_unavailable.cpp stands in).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dist/collective_smoke.h"

namespace trainer {
namespace {

using Clock = std::chrono::steady_clock;

const char* kHint =
    "HINT: export NCCL_DEBUG=INFO to see where NCCL stops; on NVSwitch hosts export NCCL_NVLS_ENABLE=0; "
    "NCCL_P2P_DISABLE=1 tells whether peer-to-peer transfers are at fault";

void cuda_check(cudaError_t e, const char* what, int device) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string(what) + " on GPU " + std::to_string(device) + ": " +
                             cudaGetErrorString(e));
}

// One communicator, stream, buffer and pair of timing events per GPU. The destructor aborts the
// communicators unless finish() completed, so an early return never leaves NCCL kernels spinning.
class LocalRing {
 public:
  LocalRing(int devices, size_t bytes) : n_(devices) {
    comms_.assign(n_, nullptr);
    streams_.assign(n_, nullptr);
    buffers_.assign(n_, nullptr);
    start_.assign(n_, nullptr);
    stop_.assign(n_, nullptr);
    for (int d = 0; d < n_; ++d) {
      cuda_check(cudaSetDevice(d), "cudaSetDevice", d);
      cuda_check(cudaStreamCreateWithFlags(&streams_[d], cudaStreamNonBlocking), "cudaStreamCreate", d);
      cuda_check(cudaMalloc(&buffers_[d], bytes), "cudaMalloc", d);
      cuda_check(cudaEventCreate(&start_[d]), "cudaEventCreate", d);
      cuda_check(cudaEventCreate(&stop_[d]), "cudaEventCreate", d);
    }
  }
  ~LocalRing() {
    for (int d = 0; d < n_; ++d) {
      if (comms_[d]) finished_ ? ncclCommDestroy(comms_[d]) : ncclCommAbort(comms_[d]);
      cudaSetDevice(d);
      if (stop_[d]) cudaEventDestroy(stop_[d]);
      if (start_[d]) cudaEventDestroy(start_[d]);
      if (buffers_[d]) cudaFree(buffers_[d]);
      if (streams_[d]) cudaStreamDestroy(streams_[d]);
    }
  }

  void init(std::chrono::milliseconds timeout) {
    ncclUniqueId id;
    nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // set-up returns at once; settle() bounds it
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (int d = 0; d < n_; ++d) {
      cuda_check(cudaSetDevice(d), "cudaSetDevice", d);
      const ncclResult_t r = ncclCommInitRankConfig(&comms_[d], n_, id, d, &config);
      if (r != ncclSuccess && r != ncclInProgress) nccl_check(r, "ncclCommInitRankConfig");
    }
    settle(ncclGroupEnd(), "communicator set-up", timeout);
  }

  void upload(size_t count) {
    std::vector<float> host(count);
    for (int d = 0; d < n_; ++d) {
      for (size_t i = 0; i < count; ++i) host[i] = smoke_fill_value(i, d);
      cuda_check(cudaSetDevice(d), "cudaSetDevice", d);
      // On the GPU's own stream: a plain cudaMemcpy from pageable memory may still be in flight when it
      // returns, and the non-blocking stream would not wait for it. Pageable sources are staged before
      // the call returns, so `host` can be refilled for the next GPU at once.
      cuda_check(cudaMemcpyAsync(buffers_[d], host.data(), count * sizeof(float), cudaMemcpyHostToDevice,
                                 streams_[d]),
                 "cudaMemcpyAsync", d);
    }
  }

  // `iterations` in-place all-reduces on every GPU, one NCCL group each; returns the slowest GPU's
  // seconds per all-reduce once all completed within `timeout`.
  double all_reduce(size_t count, ncclRedOp_t op, int iterations, std::chrono::milliseconds timeout) {
    for (int d = 0; d < n_; ++d) cuda_check(cudaEventRecord(start_[d], streams_[d]), "cudaEventRecord", d);
    for (int k = 0; k < iterations; ++k) {
      nccl_check(ncclGroupStart(), "ncclGroupStart");
      for (int d = 0; d < n_; ++d) {
        const ncclResult_t r =
            ncclAllReduce(buffers_[d], buffers_[d], count, ncclFloat, op, comms_[d], streams_[d]);
        if (r != ncclSuccess && r != ncclInProgress) nccl_check(r, "ncclAllReduce");
      }
      settle(ncclGroupEnd(), "all_reduce enqueue", timeout);
    }
    for (int d = 0; d < n_; ++d) cuda_check(cudaEventRecord(stop_[d], streams_[d]), "cudaEventRecord", d);
    wait_streams(timeout);
    float slowest_ms = 0;
    for (int d = 0; d < n_; ++d) {
      float ms = 0;
      cuda_check(cudaEventElapsedTime(&ms, start_[d], stop_[d]), "cudaEventElapsedTime", d);
      slowest_ms = std::max(slowest_ms, ms);
    }
    return slowest_ms / 1e3 / iterations;
  }

  // "" when every GPU holds the expected sum (within `tolerance`, relative), else the first wrong element.
  std::string verify(size_t count, const char* after, float tolerance) {
    std::vector<float> host(count);
    for (int d = 0; d < n_; ++d) {
      cuda_check(cudaSetDevice(d), "cudaSetDevice", d);
      cuda_check(cudaMemcpy(host.data(), buffers_[d], count * sizeof(float), cudaMemcpyDeviceToHost),
                 "cudaMemcpy", d);
      for (size_t i = 0; i < count; ++i)
        if (!smoke_matches(host[i], i, n_, tolerance))
          return "GPU " + std::to_string(d) + ": element " + std::to_string(i) + " is " +
                 std::to_string(host[i]) + " after " + after + ", expected " +
                 std::to_string(smoke_expected_sum(i, n_));
    }
    return "";
  }

  // Flushes NCCL's outstanding work; afterwards the destructor may destroy rather than abort.
  void finish(std::chrono::milliseconds timeout) {
    for (int d = 0; d < n_; ++d) {
      const ncclResult_t r = ncclCommFinalize(comms_[d]);
      if (r != ncclSuccess && r != ncclInProgress) nccl_check(r, "ncclCommFinalize");
    }
    settle(ncclSuccess, "communicator finalize", timeout);
    finished_ = true;
  }

 private:
  void nccl_check(ncclResult_t r, const char* what) {
    if (r != ncclSuccess) throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(r));
  }

  // Non-blocking mode: a call may return ncclInProgress; poll every communicator until it settles.
  void settle(ncclResult_t r, const std::string& what, std::chrono::milliseconds timeout) {
    if (r != ncclSuccess && r != ncclInProgress) nccl_check(r, what.c_str());
    const auto deadline = Clock::now() + timeout;
    for (int d = 0; d < n_; ++d) {
      ncclResult_t state = ncclInProgress;
      while (ncclCommGetAsyncError(comms_[d], &state) == ncclSuccess && state == ncclInProgress) {
        if (Clock::now() > deadline) throw std::runtime_error(timeout_message(what, timeout, d));
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      if (state != ncclSuccess)
        throw std::runtime_error("NCCL " + what + " failed on GPU " + std::to_string(d) + ": " +
                                 ncclGetErrorString(state) + " (" + ncclGetLastError(comms_[d]) + "). " +
                                 kHint);
    }
  }

  // The host polls instead of cudaStreamSynchronize so that a stuck collective ends in an error.
  void wait_streams(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    for (int d = 0; d < n_; ++d) {
      cuda_check(cudaSetDevice(d), "cudaSetDevice", d);
      for (;;) {
        const cudaError_t e = cudaEventQuery(stop_[d]);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) cuda_check(e, "all_reduce", d);
        ncclResult_t async = ncclSuccess;
        if (ncclCommGetAsyncError(comms_[d], &async) == ncclSuccess && async != ncclSuccess &&
            async != ncclInProgress)
          throw std::runtime_error(std::string("NCCL all_reduce failed on GPU ") + std::to_string(d) + ": " +
                                   ncclGetErrorString(async) + ". " + kHint);
        if (Clock::now() > deadline) throw std::runtime_error(timeout_message("all_reduce", timeout, d));
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
  }

  std::string timeout_message(const std::string& what, std::chrono::milliseconds timeout, int d) const {
    return "NCCL " + what + " across " + std::to_string(n_) + " GPUs did not complete within " +
           std::to_string(timeout.count() / 1000.0).substr(0, 4) + " s (GPU " + std::to_string(d) +
           " still waiting); the communicators were aborted. " + kHint;
  }

  int n_;
  bool finished_ = false;
  std::vector<ncclComm_t> comms_;
  std::vector<cudaStream_t> streams_;
  std::vector<void*> buffers_;
  std::vector<cudaEvent_t> start_, stop_;
};

}  // namespace

CollectiveSmoke nccl_all_reduce_smoke(const std::vector<size_t>& sizes, int iterations,
                                      std::chrono::milliseconds timeout) {
  CollectiveSmoke result;
  result.backend = "nccl";
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  result.ranks = devices;
  if (devices < 2) {
    result.error = "needs 2 or more GPUs, " + std::to_string(devices) + " visible";
    return result;
  }
  try {
    LocalRing ring(devices, *std::max_element(sizes.begin(), sizes.end()));
    ring.init(timeout);
    for (size_t bytes : sizes) {
      const size_t count = bytes / sizeof(float);
      ring.upload(count);
      ring.all_reduce(count, ncclSum, 1, timeout);
      if (std::string wrong = ring.verify(count, "sum", 0.0f); !wrong.empty())
        throw std::runtime_error(wrong);
      ring.all_reduce(count, ncclAvg, 1, timeout);  // warm-up: NCCL connects its channels lazily
      const double seconds = ring.all_reduce(count, ncclAvg, iterations, timeout);
      if (std::string wrong = ring.verify(count, "average", kAverageTolerance); !wrong.empty())
        throw std::runtime_error(wrong);
      result.timings.push_back({bytes, seconds, all_reduce_bus_bandwidth(bytes, seconds, devices)});
    }
    ring.finish(timeout);
    result.correct = true;
  } catch (const std::exception& e) {
    result.error = e.what();
    result.timings.clear();
  }
  return result;
}

}  // namespace trainer
