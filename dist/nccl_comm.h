#pragma once
// The GPU communicator: NCCL collectives on device tensors, behind the same Comm interface as CpuComm.
// Built only with the CUDA backend (CMake leaves nccl_comm.cpp out otherwise); this header is plain C++
// (no CUDA or NCCL types). Code that merely creates one goes through dist/nccl_backend.h, which every
// build links.
//
// Streams. Every collective runs on the communicator's own (high-priority) stream, never on the
// compute stream, so NCCL kernels overlap backward:
//   1. at issue, an event is recorded on the compute stream and the communication stream waits for it
//      (cudaEventRecord + cudaStreamWaitEvent): the gradients backward queued so far are complete
//      before NCCL reads them, without the host waiting for anything;
//   2. after the NCCL call, a "done" event is recorded on the communication stream;
//   3. Work::wait() makes the COMPUTE stream wait for that event and returns at once: the host is not
//      blocked, and everything queued afterwards on the compute stream (copying averaged gradients
//      back, the optimizer) runs after the collective. This is the hot path: no host sync anywhere.
// Tensors used by a collective are kept alive until the communication stream has passed its done
// event (the watchdog drops them), so the stream-ordered caching allocator cannot hand their blocks to
// new compute-stream work while NCCL still reads them (see nn/cuda/caching_allocator.h).
// Host-side waits: barrier(), all_gather (it exchanges sizes first) and collectives on CPU tensors
// (staged through device memory; the training loop's stop flag, evaluation sums, consistency checks)
// block the host, polling the done event so a failure ends the wait with the error.
//
// all_gather with a dim 0 that differs between ranks: the shapes are all-gathered first, every rank
// pads its rows to the largest dim 0, one ncclAllGather moves the padded blocks, and each rank's part
// is trimmed back to its own dim 0 (views into one buffer). The padding bytes are never read.
//
// Timeouts and failures: a watchdog thread polls every collective's done event (cudaEventQuery) and
// ncclCommGetAsyncError. A collective not done within timeout() after it was issued, or an NCCL
// error, fails the communicator: ncclCommAbort (the NCCL kernels exit, so no stream hangs) and every
// pending and later call throws DistError, e.g. "NCCL all_reduce did not complete within 10 min (...):
// a rank probably died or diverged. HINT: ...". Since Work::wait() does not block the host, a failure
// that happens after wait() returned is raised by the next call on the communicator (the next step's
// all_reduce). With a watchdog store, abort(), a failure and destruction without shutdown() post the
// reason to the store, and the other ranks' watchdogs (which look there once a collective has been
// pending for a second) fail at once with it instead of waiting out their timeout. A rank that dies
// without a word (SIGKILL, out of memory) posts nothing, and NCCL's kernels wait for it forever: with
// peer_silent_after set, the watchdog then reads every rank's heartbeat (dist/peer_liveness.h) and
// fails with "... rank 1 stopped reporting: its heartbeat has not changed for 4.2 s ..." within a few
// seconds, well inside the timeout. ncclCommAbort blocks even in non-blocking mode, so it runs on a
// thread of its own, bounded by abort_limit: a hung abort never turns the error into a hang.
//
// CUDA graphs: a collective issued while the compute stream is being captured (a whole training step
// recorded as a graph, app/train/step_graph.h) is recorded into the graph: the two events and the NCCL call
// become graph nodes and edges, and the communication stream takes part in the capture. Such a
// collective is not registered with the watchdog (querying an event recorded in a capture is invalid,
// and it would never complete); its tensors are kept until the next watch_graph_replay() (the capture
// is over by then), so the capture's allocator cannot hand them to later captured work that the graph
// does not order after NCCL. Instead, watch_graph_replay() after each cudaGraphLaunch records one event
// behind the replay on the compute stream and watches it like a collective: the same timeout, peer
// checks and abort. Collectives the host waits for cannot be captured: barrier() fails the capture
// with a DistError that says so; all_gather and collectives on CPU tensors copy between host and
// device first, which fails the capture with CUDA's error.
// A graph holding captured collectives also holds a reference on the NCCL communicator (NCCL 2.26 and
// later): destroy it before shutdown(), whose ncclCommFinalize waits for those references.
//
// Set-up: rank 0 creates the ncclUniqueId and shares it (hex) through the store under
// "nccl/<name>/<generation>/unique_id"; every rank calls ncclCommInitRankConfig (non-blocking mode, so
// a rank that never arrives makes set-up fail after connect_timeout instead of hanging).
//
// Recommended environment (set by the launcher or the user, never by this code):
//   NCCL_NVLS_ENABLE=0   NVLink SHARP needs multicast objects that containers and some drivers do not
//                        grant; with it on, communicator set-up can fail or hang on NVSwitch hosts.
//   NCCL_DEBUG=WARN      NCCL's own reason for a failure in the log (INFO for topology details).
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "dist/nccl_backend.h"

namespace trainer {

class NcclComm : public Comm {
 public:
  // Collective over the store: every rank calls it with the same name and world size. Throws DistError
  // (no CUDA backend on that device, a rank that did not arrive within connect_timeout, NCCL errors).
  static std::shared_ptr<NcclComm> create(Store& store, int rank, int world_size,
                                          const NcclCommOptions& options);
  ~NcclComm() override;

  int rank() const override;
  int world_size() const override;
  std::string backend_name() const override { return "nccl"; }
  // Device tensors of this rank's GPU (f32, f64, f16, bf16, i64; u8 for sum and max): enqueued on the
  // communication stream, returns at once; wait() orders the compute stream after it. CPU tensors
  // work too (staged through the device; wait() then blocks the host).
  std::shared_ptr<Work> all_reduce_async(Tensor tensor, ReduceOp op) override;
  void reduce_scatter(Tensor& input, Tensor& output, ReduceOp op) override;
  void broadcast(Tensor& tensor, int root) override;
  std::vector<Tensor> all_gather(const Tensor& tensor) override;
  // A 1-element all-reduce, then the host waits for the communication stream to pass it.
  void barrier() override;
  void set_timeout(std::chrono::milliseconds timeout) override;
  std::chrono::milliseconds timeout() const override;
  void abort(const std::string& reason) override;
  void watch_graph_replay(const std::string& what) override;
  void throw_if_failed() const override;
  void shutdown() override;

  // The communication stream (a cudaStream_t inside).
  runtime::Stream stream() const override;
  // Collectives and graph replays the watchdog is waiting for (tests).
  size_t pending_count() const;
  // Collectives recorded by a capture whose tensors are still held (until the next graph replay is
  // watched; tests).
  size_t captured_count() const;

  struct Impl;

 private:
  explicit NcclComm(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

}  // namespace trainer
