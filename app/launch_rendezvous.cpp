#include "app/launch_rendezvous.h"

#include <thread>

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
  // add() tells the first reporter from later ones, so the reason kept is the first failure's.
  if (store_->add(key(attempt, "failures"), 1) == 1) store_->set(key(attempt, "failed"), why);
}

std::string LauncherRendezvous::failure(int attempt) {
  try {
    if (!store_->check(key(attempt, "failed"))) return "";
    return store_->get(key(attempt, "failed"), timeout_);
  } catch (const DistError& e) {
    return std::string("the launchers' restart agreement is gone (node 0's launcher exited?): ") + e.what();
  }
}

void LauncherRendezvous::finish(int attempt) {
  try {
    store_->set(key(attempt, "ended/" + std::to_string(node_rank_)), "ok");
    if (node_rank_ == 0)
      store_->wait_for_ranks(key(attempt, "ended/"), nnodes_, timeout_,
                             "the other nodes' end of attempt " + std::to_string(attempt));
  } catch (const DistError&) {
    // This node's ranks succeeded; a node that never ends its attempt is its own launcher's to report.
  }
}

}  // namespace trainer
