#include "dist/peer_liveness.h"

#include <cstdio>

#include "dist/heartbeat.h"
#include "dist/store.h"

namespace trainer {
namespace {

std::string seconds(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

}  // namespace

PeerLiveness::PeerLiveness(int rank, int world_size, std::chrono::milliseconds silent_after)
    : rank_(rank), world_size_(world_size), silent_after_(silent_after), peers_(world_size) {}

void PeerLiveness::observe(const std::vector<std::optional<std::string>>& records, Clock::time_point now) {
  store_failing_since_.reset();
  store_error_.clear();
  for (int r = 0; r < world_size_ && r < static_cast<int>(records.size()); ++r) {
    Peer& p = peers_[r];
    if (!records[r]) continue;  // absent (or not read this time): nothing learnt
    if (p.record != records[r]) {
      p.record = records[r];
      p.since = now;
    }
  }
}

void PeerLiveness::observe_store_failure(const std::string& error, Clock::time_point now) {
  if (!store_failing_since_) store_failing_since_ = now;
  store_error_ = error;
}

std::vector<PeerLiveness::Silent> PeerLiveness::silent(Clock::time_point now) const {
  std::vector<Silent> out;
  const auto age = [&](Clock::time_point since) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(now - since);
  };
  if (store_failing_since_) {
    // Nothing can be read: every record looks frozen, but only rank 0 (which serves the store) is known
    // to be gone. The others are judged again once the store answers (it never will, if rank 0 died).
    if (rank_ != 0 && age(*store_failing_since_) > silent_after_) {
      Silent s;
      s.rank = 0;
      s.silent_for = age(*store_failing_since_);
      if (peers_[0].record) s.last_report = heartbeat_summary(*peers_[0].record);
      s.store_error = store_error_;
      out.push_back(std::move(s));
    }
    return out;
  }
  for (int r = 0; r < world_size_; ++r) {
    const Peer& p = peers_[r];
    if (r == rank_ || !p.record || age(p.since) <= silent_after_) continue;
    out.push_back({r, age(p.since), heartbeat_summary(*p.record), ""});
  }
  return out;
}

std::string describe_silent_peers(const std::vector<PeerLiveness::Silent>& silent) {
  std::string out;
  for (const auto& s : silent) {
    if (!out.empty()) out += "; ";
    if (!s.store_error.empty()) {
      out += "rank 0 cannot be reached: its rendezvous store has not answered for " + seconds(s.silent_for) +
             " (" + s.store_error + ")";
    } else {
      out += "rank " + std::to_string(s.rank) + " stopped reporting: its heartbeat has not changed for " +
             seconds(s.silent_for);
    }
    if (!s.last_report.empty()) out += " (last report: " + s.last_report + ")";
  }
  return out;
}

PeerWatch::PeerWatch(Store& store, int rank, int world_size, std::chrono::milliseconds silent_after,
                     std::chrono::milliseconds poll_every)
    : store_(store),
      world_size_(world_size),
      poll_every_(poll_every),
      liveness_(rank, world_size, silent_after) {}

std::vector<PeerLiveness::Silent> PeerWatch::poll(PeerLiveness::Clock::time_point now) {
  if (!last_poll_ || now - *last_poll_ >= poll_every_) {
    last_poll_ = now;
    std::vector<std::string> keys;
    for (int r = 0; r < world_size_; ++r) keys.push_back(heartbeat_key(r));
    try {
      const std::vector<bool> present = store_.check(keys);
      std::vector<std::optional<std::string>> records(world_size_);
      for (int r = 0; r < world_size_; ++r)
        if (present[r]) records[r] = store_.get(keys[r], std::chrono::seconds(2));
      liveness_.observe(records, now);
    } catch (const std::exception& e) {
      liveness_.observe_store_failure(e.what(), now);
    }
  }
  return liveness_.silent(now);
}

}  // namespace trainer
