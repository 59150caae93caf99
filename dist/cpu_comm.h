#pragma once
// The CPU communicator: collectives between processes over TCP, our own implementation rather than
// Gloo (see dist/README.md for why). Every pair of ranks holds one connection (a full mesh, set up
// through the rendezvous store); one worker thread per communicator executes the collectives in issue
// order, so all_reduce_async overlaps communication with the caller's compute (the gradient reducer
// all-reduces buckets while backward continues).
//
// Algorithms: all_reduce of up to 64 KiB sends every rank's tensor to every other rank and reduces in
// rank order (lowest latency; exact diagnostics); larger ones run a ring (reduce-scatter then
// all-gather, bandwidth optimal); reduce_scatter is the ring's first phase alone; broadcast is root-to-all;
// all_gather and barrier are all-to-all.
//
// Failure handling: every wait is a poll() with the collective's deadline. Each message carries the
// op, its sequence number, dtype and sizes, so ranks issuing different collectives (or different
// shapes) fail with a message that names both sides. A peer that exits or is killed closes its
// connections: whoever waits on it fails at once, naming it. A rank that fails sends the reason to
// all peers before closing (ABORT), so the failure travels along every chain of waits and each
// rank's error carries the root cause rather than "connection closed".
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dist/comm.h"
#include "dist/socket.h"

namespace trainer {

class Store;

struct CpuCommOptions {
  // Store keys live under "comm/<name>/": several communicators can share one store.
  std::string name = "default";
  // The IP this rank listens on for its peers: one they can reach (ProcessGroup passes the address of
  // this host on the route to rank 0; tests pass 127.0.0.1).
  std::string listen_address = "127.0.0.1";
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};          // each collective
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(30)};  // the rendezvous
};

class CpuComm : public Comm {
 public:
  // Collective over the store: every rank calls it with the same name and world size. Throws DistError
  // naming the ranks that did not show up within connect_timeout.
  static std::shared_ptr<CpuComm> create(Store& store, int rank, int world_size,
                                         const CpuCommOptions& options);
  ~CpuComm() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend_name() const override { return "tcp"; }
  std::shared_ptr<Work> all_reduce_async(Tensor tensor, ReduceOp op) override;
  void reduce_scatter(Tensor& input, Tensor& output, ReduceOp op) override;
  void broadcast(Tensor& tensor, int root) override;
  std::vector<Tensor> all_gather(const Tensor& tensor) override;
  void barrier() override;
  void set_timeout(std::chrono::milliseconds timeout) override;
  std::chrono::milliseconds timeout() const override;
  void abort(const std::string& reason) override;
  void shutdown() override;

  struct Transfer;   // one message to or from one peer (cpu_comm.cpp)
  struct OpContext;  // the collective being executed, for messages

 private:
  CpuComm(int rank, int world_size, const CpuCommOptions& options);
  class CpuWork;
  using Task = std::function<void(OpContext&)>;

  std::shared_ptr<CpuWork> enqueue(const char* op, Task task);
  void worker_loop();
  void send_abort_to_peers(const std::string& reason, int origin);
  // Records the rest of every send cut off by a failure in `transfers` (see unsent_).
  void remember_unsent(const std::vector<Transfer>& transfers);

  // Moves every transfer to completion, or throws DistError (timeout, peer closed or aborted,
  // mismatched collective). Also watches the peers not involved for closed connections.
  void progress(std::vector<Transfer>& transfers, OpContext& ctx);
  void move_transfers(std::vector<Transfer>& transfers,
                      OpContext& ctx);  // progress() without the bookkeeping
  // move_transfers' steps: the wake pipe fired (abort() may have asked to stop); a peer's socket is
  // ready for t; a header has just arrived whole (is it what this collective expects?).
  void throw_if_abort_requested(OpContext& ctx);
  void advance(Transfer& t, OpContext& ctx);
  void check_arrived_header(const Transfer& t, OpContext& ctx);
  [[noreturn]] void fail_peer_closed(int peer, OpContext& ctx);
  [[noreturn]] void fail_timeout(const std::vector<Transfer>& transfers, OpContext& ctx);

  void run_all_reduce(Tensor& t, ReduceOp op, OpContext& ctx);
  void all_reduce_flat(char* data, size_t count, DType dtype, ReduceOp op, OpContext& ctx);
  void all_reduce_ring(char* data, size_t count, DType dtype, ReduceOp op, OpContext& ctx);
  // The ring's reduce-scatter phase, in place on `data` cut into world_size chunks; returns the chunk
  // this rank holds reduced afterwards, (rank + 1 + offset) % world_size (avg already divided).
  int ring_reduce_scatter(char* data, size_t count, DType dtype, ReduceOp op, int offset, OpContext& ctx);
  // Sends `send` to every peer and receives recv_len[p] bytes from each peer p into recv[p].
  void run_flat_exchange(const void* send, size_t send_len, const std::vector<char*>& recv,
                         const std::vector<size_t>& recv_len, uint32_t aux, OpContext& ctx);
  // One receive buffer per peer of at least `bytes_each`, reused across collectives (worker only).
  std::vector<char*> scratch_buffers(size_t bytes_each);

  int rank_;
  int world_size_;
  CpuCommOptions options_;
  std::vector<net::Socket> peers_;    // by rank; peers_[rank_] unused
  std::vector<bool> send_mid_frame_;  // a message to this peer was cut off (no ABORT can follow it)
  // What is left of a message cut off by a failure (header bytes, then payload), copied: the buffer it
  // came from may belong to the failed task and be gone by the time the ABORT goes out. Finishing it
  // lets the ABORT with the root cause follow instead of a bare "connection closed"; the payload is
  // the genuine data, so a receiver that completes its collective with it has the right result.
  struct UnsentRest {
    std::string bytes;
  };
  std::vector<UnsentRest> unsent_;  // by peer; worker thread only
  std::vector<bool> recv_mid_frame_;
  int wake_[2] = {-1, -1};                  // abort() wakes the worker's poll through this pipe
  uint64_t next_seq_ = 0;                   // worker thread only
  std::vector<std::vector<char>> scratch_;  // worker thread only

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::pair<std::shared_ptr<CpuWork>, Task>> queue_;
  std::string failure_;        // first error; the communicator is unusable once set
  std::string abort_request_;  // set by abort(), handled by the worker
  bool abort_sent_ = false;
  bool stopping_ = false;
  bool closed_ = false;  // shutdown() completed
  std::chrono::milliseconds timeout_;
  std::thread worker_;
};

}  // namespace trainer
