#include "app/commands/launch/launch_rendezvous.h"

#include <thread>
#include <vector>

#include "dist/error.h"
#include "dist/store.h"

namespace trainer {

LauncherRendezvous::LauncherRendezvous(const LaunchArgs& a, std::chrono::milliseconds timeout)
    : node_rank_(a.node_rank), nnodes_(a.nnodes), max_restarts_(a.max_restarts), timeout_(timeout) {
  TcpStoreOptions o;
  o.host = a.master_addr;
  o.port = a.master_port + 1;
  o.is_server = a.node_rank == 0;
  o.port_name = "MASTER_PORT + 1 (the launchers' restart agreement)";
  o.world_size = a.nnodes;
  o.job_id = "trainer-launch";
  o.connect_timeout = timeout;
  // The supervision loop asks about failures twice a second: a stalled node 0 must not hold it (and
  // the relaying of the ranks' output) for the default minute.
  o.reply_timeout = std::chrono::seconds(5);
  store_ = std::make_unique<TcpStore>(o);
}

LauncherRendezvous::~LauncherRendezvous() = default;

std::string LauncherRendezvous::key(int attempt, const std::string& what) const {
  return "attempt/" + std::to_string(attempt) + "/" + what;
}

LauncherRendezvous::AttemptStart LauncherRendezvous::begin(int attempt, const std::string& run_id,
                                                           const std::string& run_dir) {
  if (node_rank_ == 0) {
    store_->set(key(attempt, "run_id"), run_id);
    store_->set(key(attempt, "run_dir"), run_dir);
    store_->set(key(attempt, "max_restarts"), std::to_string(max_restarts_));
  }
  store_->set(key(attempt, "node/" + std::to_string(node_rank_)), "here");
  store_->wait_for_ranks(key(attempt, "node/"), nnodes_, timeout_,
                         "the launchers' start of attempt " + std::to_string(attempt));
  AttemptStart start{store_->get(key(attempt, "run_id"), timeout_),
                     store_->get(key(attempt, "run_dir"), timeout_)};
  const std::string theirs = store_->get(key(attempt, "max_restarts"), timeout_);
  if (theirs != std::to_string(max_restarts_))
    throw DistError("node " + std::to_string(node_rank_) + " was launched with --max-restarts " +
                    std::to_string(max_restarts_) + " but node 0 with " + theirs +
                    ". HINT: give every node's launcher the same flags");
  return start;
}

void LauncherRendezvous::report_failure(int attempt, const std::string& why) {
  try {
    // add() tells the first reporter from later ones, so the reason kept is the first failure's.
    if (store_->add(key(attempt, "failures"), 1) == 1) store_->set(key(attempt, "failed"), why);
  } catch (const DistError&) {
    // Node 0's launcher is gone or stalled: its ranks, and so every other node's, fail on their own.
  }
}

std::string LauncherRendezvous::failure(int attempt) {
  try {
    if (!store_->check(key(attempt, "failed"))) return "";
    return store_->get(key(attempt, "failed"), timeout_);
  } catch (const DistError& e) {
    return std::string("the launchers' restart agreement is gone (node 0's launcher exited?): ") + e.what();
  }
}

// Node 0: waits until every node has ended `attempt` or one reported a failure; "" or why not.
std::string LauncherRendezvous::wait_for_every_end(int attempt) {
  // A node whose rank fails after this node's ranks ended (a full disk for its log, say) must not
  // wait for an end that never comes while node 0 reports success.
  std::vector<std::string> ended;
  for (int n = 0; n < nnodes_; ++n) ended.push_back(key(attempt, "ended/" + std::to_string(n)));
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (std::chrono::steady_clock::now() < deadline) {
    if (std::string why = failure(attempt); !why.empty()) return why;
    if (store_->wait_for(ended, std::chrono::seconds(1)).empty()) return failure(attempt);
  }
  return "node(s) did not end attempt " + std::to_string(attempt) + " within " +
         std::to_string(std::chrono::duration_cast<std::chrono::seconds>(timeout_).count()) + " s";
}

std::string LauncherRendezvous::finish(int attempt) {
  // Node 0 publishes the attempt's verdict and serves the store until every node that ended has read
  // it: asking node 0's store for failures after setting "ended" raced with node 0's exit, and a node
  // whose ranks all succeeded then reported the job failed (seen in CI, session 12).
  const std::string succeeded = "succeeded";
  try {
    store_->set(key(attempt, "ended/" + std::to_string(node_rank_)), "ok");
    if (node_rank_ != 0) {
      // Node 0 answers when its own ranks have ended and every node has. A node that fails meanwhile
      // (node 0's included: it then restarts or exits without answering) ends the wait at once.
      const std::vector<std::string> verdict_key{key(attempt, "verdict")};
      const auto deadline = std::chrono::steady_clock::now() + 2 * timeout_;
      while (!store_->wait_for(verdict_key, std::chrono::seconds(1)).empty()) {
        if (std::string why = failure(attempt); !why.empty()) return why;
        if (std::chrono::steady_clock::now() >= deadline)
          return "node 0 gave no verdict on attempt " + std::to_string(attempt) + " within " +
                 std::to_string(std::chrono::duration_cast<std::chrono::seconds>(2 * timeout_).count()) +
                 " s";
      }
      const std::string verdict = store_->get(verdict_key[0], timeout_);
      try {
        store_->set(key(attempt, "read/" + std::to_string(node_rank_)), "ok");
      } catch (const DistError&) {
        // Node 0 stopped waiting for this acknowledgement: the verdict read stands.
      }
      return verdict == succeeded ? "" : verdict;
    }
    const std::string why = wait_for_every_end(attempt);
    store_->set(key(attempt, "verdict"), why.empty() ? succeeded : why);
    // Nodes that have not ended are restarting or gone: only those that ended will read the verdict.
    std::vector<std::string> reads;
    for (int n = 1; n < nnodes_; ++n)
      if (store_->check(key(attempt, "ended/" + std::to_string(n))))
        reads.push_back(key(attempt, "read/" + std::to_string(n)));
    store_->wait_for(reads, timeout_);  // a node that died after ending is not waited for longer
    return why;
  } catch (const WaitInterrupted&) {
    throw;  // a stop signal: the caller exits with it
  } catch (const DistError& e) {
    return std::string("the launchers' restart agreement failed at the end: ") + e.what();
  }
}

}  // namespace trainer
