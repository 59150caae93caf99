#pragma once
// The rendezvous key-value store: rank 0 serves it on a TCP port from a background thread, every rank
// (rank 0 included) is a client. Ranks use it to find each other (communicator addresses, the NCCL
// unique id), to agree at start-up (consistency checks) and for barriers outside the communicator.
// Values are byte strings; `add` keeps a decimal counter. Every blocking call has a timeout and its
// error names the key(s) and, for rank-indexed keys, which ranks never arrived.
//
// Under torchrun, ProcessEnv::store_port is MASTER_PORT+1 (torchrun's agent holds MASTER_PORT with
// its own store); see dist/process_env.h. A client checks on connect that it talks to a trainer
// store (a handshake), so a port taken by another service fails with a clear message, not garbage.
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dist/socket.h"

namespace trainer {

// What may end a store wait early: `pending_signal` returns the number of a stop signal received (0:
// none). The waits of the thread that set it (not the watchdog's or heartbeat's threads) check it
// about once a second and throw WaitInterrupted when it is set; so does a client still trying to reach
// rank 0's store. The trainer passes its stop handler's flag (app/train/train_signals.h) for its start-up,
// so that SIGTERM or Ctrl-C while a rank waits for the others (a peer that never came, a slow node)
// ends the process at once instead of after dist.timeout_seconds. Unset (null), waits run to their
// timeouts. The communicators' set-up (CpuComm's peer connections, NCCL's initialisation) checks it
// the same way (stop_check, throw_if_stop_pending).
void set_store_wait_interrupt(std::function<int()> pending_signal);
// The callback runs under a process-wide mutex: it must not use the store. A thread that set it should
// clear it (nullptr) before it ends.
// The stop signal set_store_wait_interrupt reports for this thread now (0: none, or not set).
int pending_stop_signal();
// Throws WaitInterrupted: "stopped by signal N (name) while <doing>".
[[noreturn]] void throw_stopped(int signal, const std::string& doing);
// throw_stopped when pending_stop_signal() is set.
void throw_if_stop_pending(const std::string& doing);
// For the connection loops (net::connect_with_retry, net::accept_until): a check that throws on a stop
// signal, or an empty function when this thread's waits are not interruptible (they then keep their
// plain behaviour).
std::function<void()> stop_check(const std::string& doing);

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const std::string& value) = 0;
  // Blocks until `key` exists, then returns its value; throws DistError after `timeout`.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Atomically adds `delta` to the counter at `key` (created at 0) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Which of `keys` exist now (does not block).
  virtual std::vector<bool> check(const std::vector<std::string>& keys) = 0;
  // Blocks until every key exists or `timeout` passes; returns the keys still missing (empty = all set).
  virtual std::vector<std::string> wait_for(const std::vector<std::string>& keys,
                                            std::chrono::milliseconds timeout) = 0;
  // Deletes `key`; whether it existed.
  virtual bool remove(const std::string& key) = 0;
  // "127.0.0.1:29500" for messages.
  virtual std::string address() const = 0;

  bool check(const std::string& key) { return check(std::vector<std::string>{key})[0]; }
  // wait_for that throws DistError naming the missing keys.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);

  // Waits for the keys prefix + "0" ... prefix + (world_size - 1); on timeout throws DistError
  // "<what> timed out after 30 s: 2 of 3 ranks arrived; missing rank(s): 2. HINT: ...".
  void wait_for_ranks(const std::string& prefix, int world_size, std::chrono::milliseconds timeout,
                      const std::string& what);
  // A barrier of `world_size` ranks built on add + wait; each call with the same name is a new
  // generation, so it can run every epoch. Throws naming the ranks that did not arrive.
  void barrier(const std::string& name, int rank, int world_size, std::chrono::milliseconds timeout);

 private:
  std::mutex barrier_mutex_;
  std::map<std::string, int64_t> barrier_generation_;
};

struct TcpStoreOptions {
  std::string host = "127.0.0.1";         // where rank 0 serves (MASTER_ADDR)
  int port = 29500;                       // the server may pass 0 for any free port (tests): read port()
  bool is_server = false;                 // rank 0: serve, then connect to ourselves
  std::string bind_host;                  // server: "" listens on every interface
  std::string port_name = "MASTER_PORT";  // how the port-in-use message names the port
  // Checked in the handshake: a client of another job or world size is refused with a clear error
  // instead of joining (two jobs on one MASTER_PORT). world_size 0 = not checked.
  int world_size = 0;
  std::string job_id;
  // How long a client retries reaching rank 0 (rank 0 may start later than the others).
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(30)};
  // Bound on any reply from the server (besides the caller's own wait timeouts).
  std::chrono::milliseconds reply_timeout{std::chrono::seconds(60)};
};

class StoreServer;

class TcpStore : public Store {
 public:
  // Throws DistError: "MASTER_PORT 29500 is already in use on this host. HINT: ..." (server) or
  // "cannot reach rank 0 at host:port after 30 s ... HINT: ..." (client).
  explicit TcpStore(const TcpStoreOptions& options);
  ~TcpStore() override;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::vector<bool> check(const std::vector<std::string>& keys) override;
  using Store::check;
  std::vector<std::string> wait_for(const std::vector<std::string>& keys,
                                    std::chrono::milliseconds timeout) override;
  bool remove(const std::string& key) override;
  std::string address() const override;

  int port() const { return port_; }
  // This host's IP on the route to rank 0: the address other ranks can reach this rank on.
  std::string local_address() const { return local_address_; }

 private:
  // One request and its reply on the connection. After a timeout the next request reconnects first
  // (rank 0 may just have been slow); after a lost or refused connection every request fails at once.
  std::string request(const std::string& body, net::Deadline deadline, const std::string& what);
  net::IoStatus exchange(const std::string& body, net::Deadline deadline, const std::string& what,
                         std::string& reply, std::string& why);
  void reconnect(net::Deadline deadline);
  // The first request's reply, waited for where a stop signal can end the wait (see the .cpp).
  std::string handshake(const std::string& body, net::Deadline deadline);

  TcpStoreOptions options_;
  int port_ = 0;
  std::unique_ptr<StoreServer> server_;
  std::mutex mutex_;  // one request at a time on the connection
  net::Socket socket_;
  std::string broken_;          // why the connection is unusable, once it is
  bool reconnectable_ = false;  // broken by a timeout: the next request tries a fresh connection
  std::string local_address_;
};

}  // namespace trainer
