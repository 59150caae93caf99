#pragma once
// What every rank is doing, for the message of a collective that failed. Each rank publishes a small
// record to the rendezvous store about once a second from its own thread and store connection: its
// step, the phase it is in (data_wait, forward, ..., evaluation, checkpoint) and since when. When a
// collective times out, the rank that noticed reads every rank's record, so the message can tell
// apart the three causes that look alike from inside the collective:
//   rank 1: step 812, in data_wait for 31.0 s (reported 0.4 s ago): alive but not in this collective
//   rank 2: no report for 29.8 s (last: step 811, backward): the process died or is frozen
//   rank 3: step 811, in allreduce_exposed ...: one step behind the others
// (PyTorch's flight recorder dumps the same kind of history to files per rank, to be compared by hand.)
// The time in a phase is measured by the reporting rank; the age of a report compares the wall clocks
// of two hosts, so "no report for N s" assumes clocks synchronised to well under 3 intervals (NTP).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

namespace trainer {

class Store;

class Heartbeat {
 public:
  // `store`: a connection of this rank's own (the main one may sit in a long wait). Publishes at once,
  // then every `interval`.
  Heartbeat(std::unique_ptr<Store> store, int rank, int world_size,
            std::chrono::milliseconds interval = std::chrono::seconds(1));
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // Cheap (no I/O): the publishing thread sends the latest values.
  void set_step(int64_t step);
  void set_phase(std::string_view phase);

  // One line per rank from the records in the store, read within `timeout` in all; a heading says how
  // to read them. Never throws (a failure to read says so in the text).
  std::string describe_ranks(std::chrono::milliseconds timeout = std::chrono::seconds(2));

  std::chrono::milliseconds interval() const { return interval_; }

 private:
  void publish();
  void run();

  std::unique_ptr<Store> store_;
  const int rank_, world_size_;
  const std::chrono::milliseconds interval_;
  std::mutex mutex_;  // guards phase_, phase_since_ms_ and stopping_ (TcpStore locks its own requests)
  std::condition_variable cv_;
  std::string phase_ = "start-up";
  int64_t phase_since_ms_ = 0;
  std::atomic<int64_t> step_{0};
  bool stopping_ = false;
  std::thread thread_;
};

// Records heartbeat.describe_ranks() when the scope is left by an exception, while the process group
// (and rank 0's store) still exists; the top-level handler adds failure_context() to the message of a
// failed collective. Declared right after the process group in the training loop.
class DescribeRanksOnFailure {
 public:
  explicit DescribeRanksOnFailure(Heartbeat* heartbeat);
  ~DescribeRanksOnFailure();
  DescribeRanksOnFailure(const DescribeRanksOnFailure&) = delete;
  DescribeRanksOnFailure& operator=(const DescribeRanksOnFailure&) = delete;

 private:
  Heartbeat* heartbeat_;
  int uncaught_;
};

// The store key of `rank`'s record, and "step 812, backward" from a record's text ("" if malformed):
// for readers of the records other than describe_ranks() (dist/peer_liveness.h).
std::string heartbeat_key(int rank);
std::string heartbeat_summary(const std::string& record);

// The description recorded by the last DescribeRanksOnFailure that saw an exception; "" if none.
std::string failure_context();

}  // namespace trainer
