#pragma once
// The communicator interface every data-parallel piece talks to: all-reduce, reduce-scatter, broadcast,
// all-gather and barrier over the ranks of one job. Backends: CpuComm (dist/cpu_comm.h, TCP between
// processes, for CPU tensors), SingleProcessComm (world size 1: every call is free), and NcclComm
// for CUDA tensors.
//
// Contract, for every backend:
//   - Every rank issues the same collectives in the same order, with tensors of the same shape and dtype
//     (all_gather: dim 0 may differ). A rank that diverges gets an error naming the collective and the
//     rank it disagrees with, never a hang.
//   - Every collective finishes or throws DistError within timeout(): the message names the operation,
//     its sequence number and the rank(s) that did not arrive or closed their connection when that is
//     known. A peer process that dies makes the others fail at once (its sockets close).
//   - After a failure the communicator is unusable: later calls throw with the first error. Recovery is
//     a restart of the job (torchrun --max-restarts, SLURM requeue), as with NCCL.
//   - all_reduce results are bitwise identical on every rank (each element is reduced in one fixed order),
//     so parameters updated from averaged gradients stay identical.
//   - *_async calls return at once; the tensor must not be touched until Work::wait() returns. Calls are
//     executed in issue order, so an async all-reduce followed by a blocking barrier is fine.
//
// For NCCL (dist/nccl_comm.h): all_reduce_async enqueues on the communicator's stream after an event on the
// current compute stream; Work::wait() makes the compute stream wait for the collective's event (it
// does not block the host); the timeout is enforced by a watchdog thread that aborts the NCCL
// communicator (ncclCommAbort) and fails the pending Work with the op's name.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "nn/runtime.h"
#include "nn/tensor.h"

namespace trainer {

enum class ReduceOp : uint8_t { sum, avg, max };
std::string_view reduce_op_name(ReduceOp op);

// A collective in flight.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the collective has finished; rethrows its DistError.
  virtual void wait() = 0;
  virtual bool completed() const = 0;
};

class Comm {
 public:
  virtual ~Comm() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string backend_name() const = 0;  // "tcp", "nccl", "single"

  // In place on every rank: sum, mean (sum / world_size) or max. f32, f64; i64 for sum and max.
  virtual std::shared_ptr<Work> all_reduce_async(Tensor tensor, ReduceOp op) = 0;
  void all_reduce(Tensor& tensor, ReduceOp op) { all_reduce_async(tensor, op)->wait(); }
  // Reduces every rank's `input` (numel world_size * k, the same on every rank) and leaves chunk `rank` of
  // the result in `output` (numel k, contiguous): output[i] = op over ranks of input[rank * k + i]. sum,
  // avg, max as all_reduce. The ZeRO optimizer's gradient reduction (dist/zero_optimizer.h): half the
  // traffic of an all-reduce, and each rank receives only the shard it updates. `input` may be used as
  // scratch space (the CPU ring accumulates in it): its contents are unspecified afterwards.
  virtual void reduce_scatter(Tensor& input, Tensor& output, ReduceOp op) = 0;
  // Copies root's tensor into every rank's tensor (same shape and dtype on every rank).
  virtual void broadcast(Tensor& tensor, int root) = 0;
  // Every rank's tensor, in rank order, contiguous, on the input's device. Safe for tensors whose dim 0
  // differs between ranks (uneven last batches in evaluation): sizes are exchanged first, nothing is
  // padded or truncated. Other dims and the dtype must agree (an error names the ranks that differ).
  virtual std::vector<Tensor> all_gather(const Tensor& tensor) = 0;
  // all_gather concatenated along dim 0.
  Tensor all_gather_cat(const Tensor& tensor);
  // Returns when every rank has called it; on timeout the error names the ranks that did not arrive.
  virtual void barrier() = 0;

  // Limit on each collective, counted from when it starts executing.
  virtual void set_timeout(std::chrono::milliseconds timeout) = 0;
  virtual std::chrono::milliseconds timeout() const = 0;

  // Fails this communicator on purpose (a rank hit an error the others cannot see, e.g. an unused
  // parameter): pending and later calls throw, and the other ranks' collectives fail at once with
  // `reason` instead of waiting out the timeout. Blocks briefly until peers were told.
  virtual void abort(const std::string& reason) = 0;
  // Throws the DistError this communicator failed with (a timeout, a dead peer, an abort), if it
  // failed. For waits outside the communicator that depend on its work: on a GPU the training loop
  // waits for events queued behind NCCL kernels, which a dead peer can leave spinning.
  virtual void throw_if_failed() const {}
  // CUDA graphs: a collective issued while the compute stream is being captured is recorded into the
  // graph, not run, so it cannot be watched on its own. After each replay of such a graph the caller
  // calls this: the replay is watched as one unit, with a collective's timeout and failure handling,
  // and `what` names it in the error. A no-op for communicators whose collectives are never captured.
  virtual void watch_graph_replay(const std::string& what) { (void)what; }
  // The device stream its collectives run on, so that timing can put its marks there (the step timer's
  // all-reduce phase); none for communicators that queue nothing on a device stream of their own.
  virtual runtime::Stream stream() const { return {}; }
  // Orderly end: a last collective so that no rank closes its connections while another still
  // communicates, then closes them. Every rank calls it once after its last collective; without it, a
  // rank that exits early can make a slower rank's last collective fail.
  virtual void shutdown() = 0;
};

// Throws DistError unless reduce_scatter's tensors fit: same dtype, input numel = world_size x output
// numel, 1-D output. Shared by the backends.
void check_reduce_scatter_shapes(const Tensor& input, const Tensor& output, int world_size);

// all_gather's first phase, shared by the backends: every rank sends its dtype and shape as
// kGatherMetaWords int64 words (dtype, number of dims, up to 8 sizes).
constexpr int kGatherMetaWords = 10;
std::vector<int64_t> gather_meta(const Tensor& t);  // throws DistError beyond 8 dims
// From every rank's words (rank-major): throws DistError naming each rank's shape and dtype unless they
// agree in dtype and in every dim but dim 0; returns the shapes.
std::vector<Shape> check_gather_meta(const int64_t* metas, int world_size, const std::string& what);

// World size 1: nothing to communicate, every call returns at once without copying.
class SingleProcessComm : public Comm {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string backend_name() const override { return "single"; }
  std::shared_ptr<Work> all_reduce_async(Tensor tensor, ReduceOp op) override;
  void reduce_scatter(Tensor& input, Tensor& output, ReduceOp op) override;
  void broadcast(Tensor& tensor, int root) override;
  std::vector<Tensor> all_gather(const Tensor& tensor) override;
  void barrier() override {}
  void set_timeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  void abort(const std::string&) override {}
  void shutdown() override {}

 private:
  std::chrono::milliseconds timeout_{std::chrono::minutes(10)};
};

}  // namespace trainer
