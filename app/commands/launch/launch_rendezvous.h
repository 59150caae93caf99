#pragma once
// How the launchers of a multi-node job agree on restarts (`trainer launch --nnodes M
// --max-restarts N`). Node 0's launcher serves a small store on MASTER_PORT + 1 (the ranks' own store
// is on MASTER_PORT); every launcher is its client. Per attempt k:
//   - every launcher arrives at attempt k before any starts its ranks, and they agree on the job's
//     run id, --max-restarts, and the run directory node 0's rank 0 announced in attempt k - 1;
//   - a launcher whose rank fails says so, and the others see it within half a second and stop their
//     ranks at once, instead of waiting for the ranks to notice the dead peer;
//   - a launcher whose ranks all succeeded says so; node 0's publishes the attempt's verdict once every
//     node has ended (or one failed) and serves until every node that ended has read it.
// So every node restarts (or not) together, from the same checkpoint, never leaving ranks waiting for
// peers that started over.
#include <chrono>
#include <memory>
#include <string>

#include "app/commands/launch/launch_command.h"

namespace trainer {

class TcpStore;

class LauncherRendezvous {
 public:
  // Node 0 serves, the others connect (retrying up to `timeout`). Throws DistError with a hint.
  LauncherRendezvous(const LaunchArgs& a, std::chrono::milliseconds timeout);
  ~LauncherRendezvous();

  struct AttemptStart {
    std::string run_id;   // node 0's TRAINER_RUN_ID for the job
    std::string run_dir;  // the run directory node 0's rank 0 announced so far ("" if none)
  };
  // Waits for every node's launcher to reach `attempt`; node 0 publishes `run_id` and `run_dir`
  // first, the others receive them. Throws DistError naming the missing nodes after the timeout, or
  // when the nodes' --max-restarts differ.
  AttemptStart begin(int attempt, const std::string& run_id, const std::string& run_dir);
  // This node's rank failed in `attempt` (the first report wins; later ones are kept apart). Never
  // throws: a store that is gone leaves the other nodes to notice the dead ranks themselves.
  void report_failure(int attempt, const std::string& why);
  // "" while no node reported a failure in `attempt`; what the first one said otherwise. A store that
  // is gone (node 0's launcher died) is a failure too.
  std::string failure(int attempt);
  // This node's ranks all succeeded in `attempt`. Node 0 waits (up to the timeout) until every node
  // has ended the attempt or one failed, publishes that verdict and serves until every node that
  // ended has read it; the others wait for the verdict. Returns another node's failure in `attempt`
  // ("" if none): the job did not succeed.
  std::string finish(int attempt);

 private:
  std::string wait_for_every_end(int attempt);
  std::string key(int attempt, const std::string& what) const;
  std::unique_ptr<TcpStore> store_;
  int node_rank_, nnodes_, max_restarts_;
  std::chrono::milliseconds timeout_;
};

}  // namespace trainer
