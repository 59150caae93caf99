#include "dist/heartbeat.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <vector>

#include "dist/store.h"

namespace trainer {
namespace {

int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// "<sent ms> <step> <ms in the phase when sent> <phase>": the phase last, it is free text. The time in
// the phase is measured on the sender's clock, so it is right whatever the skew between hosts.
std::string encode(int64_t sent_ms, int64_t step, int64_t in_phase_ms, const std::string& phase) {
  return std::to_string(sent_ms) + ' ' + std::to_string(step) + ' ' + std::to_string(in_phase_ms) + ' ' +
         phase;
}

struct Record {
  int64_t sent_ms = 0, step = 0, in_phase_ms = 0;
  std::string phase;
};

bool decode(const std::string& text, Record& r) {
  std::istringstream in(text);
  if (!(in >> r.sent_ms >> r.step >> r.in_phase_ms)) return false;
  in.get();
  std::getline(in, r.phase);
  return true;
}

// Phases in which a rank issues no collective: a peer waiting in one for long is waiting on this rank.
// The training loop names every stretch with collectives outside the step (epoch start and end,
// evaluation, the barrier after a checkpoint), so data_wait and h2d are never stale labels for them.
// forward communicates with SyncBatchNorm, so it is not listed; nor is start-up (consistency checks).
bool communicates(const std::string& phase) {
  return !(phase == "data_wait" || phase == "h2d" || phase == "checkpoint");
}

std::string seconds(int64_t ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(ms) / 1000.0);
  return buf;
}

std::mutex g_context_mutex;
std::string g_failure_context;

}  // namespace

std::string heartbeat_key(int rank) { return "trainer/heartbeat/" + std::to_string(rank); }

std::string heartbeat_summary(const std::string& record) {
  Record r;
  if (!decode(record, r)) return "";
  return "step " + std::to_string(r.step) + ", " + r.phase;
}

Heartbeat::Heartbeat(std::unique_ptr<Store> store, int rank, int world_size,
                     std::chrono::milliseconds interval)
    : store_(std::move(store)), rank_(rank), world_size_(world_size), interval_(interval) {
  phase_since_ms_ = wall_ms();
  publish();
  thread_ = std::thread([this] { run(); });
}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Heartbeat::set_step(int64_t step) { step_.store(step, std::memory_order_relaxed); }

void Heartbeat::set_phase(std::string_view phase) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (phase_ == phase) return;
  phase_.assign(phase);
  phase_since_ms_ = wall_ms();
}

void Heartbeat::publish() {
  std::string value;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const int64_t now = wall_ms();
    value = encode(now, step_.load(std::memory_order_relaxed), std::max<int64_t>(0, now - phase_since_ms_),
                   phase_);
  }
  try {
    store_->set(heartbeat_key(rank_), value);
  } catch (const std::exception&) {
    // The store (rank 0) is gone: the collectives report that; nothing to publish to.
  }
}

void Heartbeat::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!cv_.wait_for(lock, interval_, [&] { return stopping_; })) {
    lock.unlock();
    publish();
    lock.lock();
  }
}

std::string Heartbeat::describe_ranks(std::chrono::milliseconds timeout) {
  std::ostringstream out;
  out << "what each rank last reported (every " << seconds(interval_.count()) << ", through the store):";
  std::vector<std::string> keys;
  for (int r = 0; r < world_size_; ++r) keys.push_back(heartbeat_key(r));
  std::vector<bool> present;
  try {
    present = store_->check(keys);
  } catch (const std::exception& e) {
    out << "\n  (the store cannot be read: " << e.what() << "; rank 0, which serves it, may be gone)";
    return out.str();
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<Record> records(world_size_);
  std::vector<bool> have(world_size_, false);
  int64_t max_step = 0;
  for (int r = 0; r < world_size_; ++r) {
    if (!present[r]) continue;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    try {
      have[r] = decode(store_->get(keys[r], left), records[r]);
    } catch (const std::exception&) {
      have[r] = false;
    }
    if (have[r]) max_step = std::max(max_step, records[r].step);
  }
  const int64_t now = wall_ms();
  const int64_t stale_ms = 3 * interval_.count() + 1000;
  for (int r = 0; r < world_size_; ++r) {
    out << "\n  rank " << r << (r == rank_ ? " (this rank)" : "") << ": ";
    if (!have[r]) {
      out << "no report (it never got past start-up, or the store could not be read in time)";
      continue;
    }
    const Record& rec = records[r];
    const int64_t age = std::max<int64_t>(0, now - rec.sent_ms);  // 0 when the reader's clock is behind
    if (age > stale_ms) {
      out << "no report for " << seconds(age) << " (last: step " << rec.step << ", " << rec.phase
          << "): the process died or is frozen";
      continue;
    }
    out << "step " << rec.step << ", in " << rec.phase << " for " << seconds(rec.in_phase_ms + age)
        << " (reported " << seconds(age) << " ago)";
    if (rec.step < max_step) {
      out << ": " << (max_step - rec.step) << " step(s) behind";
    } else if (!communicates(rec.phase)) {
      out << ": alive, but not in a collective";
    }
  }
  return out.str();
}

DescribeRanksOnFailure::DescribeRanksOnFailure(Heartbeat* heartbeat)
    : heartbeat_(heartbeat), uncaught_(std::uncaught_exceptions()) {}

DescribeRanksOnFailure::~DescribeRanksOnFailure() {
  if (!heartbeat_ || std::uncaught_exceptions() <= uncaught_) return;
  try {
    std::string text = heartbeat_->describe_ranks();
    std::lock_guard<std::mutex> lock(g_context_mutex);
    g_failure_context = std::move(text);
  } catch (...) {  // a destructor during unwinding must not throw; the failure's own message remains
  }
}

std::string failure_context() {
  std::lock_guard<std::mutex> lock(g_context_mutex);
  return g_failure_context;
}

}  // namespace trainer
