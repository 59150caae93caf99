#pragma once
// Which peer ranks are dead, judged from their heartbeats (dist/heartbeat.h), for a communicator that
// cannot tell by itself. NCCL over NVLink or shared memory never notices a peer process that was
// killed: its kernels spin on flags the dead peer will not set, and only the collective's timeout (10
// min by default) would end the wait. The NCCL watchdog therefore asks a PeerWatch, once a second while
// a collective has been pending for more than a second, whether some rank stopped reporting; if one
// did, it aborts the communicator with a message naming that rank.
//
// Liveness is judged on this rank's steady clock, never by comparing two hosts' wall clocks: a rank is
// silent when its record in the store has not changed for `silent_after` (every record carries its
// send time, so a living rank's record changes at every report). A record never seen is not judged (the
// rank has not started its heartbeat yet). Rank 0 serves the store: when the store itself cannot be
// read for `silent_after`, rank 0 is the silent one.
#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace trainer {

class Store;

class PeerLiveness {
 public:
  using Clock = std::chrono::steady_clock;

  PeerLiveness(int rank, int world_size, std::chrono::milliseconds silent_after);

  // One reading of every rank's heartbeat record (nullopt: absent) at `now`.
  void observe(const std::vector<std::optional<std::string>>& records, Clock::time_point now);
  // The store could not be read at `now`; `error` says why.
  void observe_store_failure(const std::string& error, Clock::time_point now);

  struct Silent {
    int rank = 0;
    std::chrono::milliseconds silent_for{0};
    std::string last_report;  // "step 812, backward" from its last record; "" if unknown
    std::string store_error;  // rank 0 when the store cannot be read: why
  };
  // The peers (never this rank) silent for longer than silent_after at `now`, in rank order.
  std::vector<Silent> silent(Clock::time_point now) const;

  std::chrono::milliseconds silent_after() const { return silent_after_; }

 private:
  struct Peer {
    std::optional<std::string> record;  // the last value read
    Clock::time_point since{};          // when `record` was first read with this value
  };
  int rank_, world_size_;
  std::chrono::milliseconds silent_after_;
  std::vector<Peer> peers_;
  std::optional<Clock::time_point> store_failing_since_;
  std::string store_error_;
};

// "rank 1 stopped reporting: no heartbeat for 4.2 s (last: step 812, backward) ...": one sentence per
// silent rank, for the error of the collective that waited for them. "" when `silent` is empty.
std::string describe_silent_peers(const std::vector<PeerLiveness::Silent>& silent);

// Reads the heartbeat records through `store` (a connection of the caller's own) at most once per
// `poll_every` and keeps a PeerLiveness. Used from one thread.
class PeerWatch {
 public:
  PeerWatch(Store& store, int rank, int world_size, std::chrono::milliseconds silent_after,
            std::chrono::milliseconds poll_every = std::chrono::seconds(1));

  // Reads the records if a poll is due, then returns the ranks silent at `now`.
  std::vector<PeerLiveness::Silent> poll(PeerLiveness::Clock::time_point now);
  const PeerLiveness& liveness() const { return liveness_; }

 private:
  Store& store_;
  int world_size_;
  std::chrono::milliseconds poll_every_;
  std::optional<PeerLiveness::Clock::time_point> last_poll_;
  PeerLiveness liveness_;
};

}  // namespace trainer
