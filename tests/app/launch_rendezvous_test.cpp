// The launchers' end-of-attempt agreement (app/commands/launch/launch_rendezvous.h): a node whose
// ranks all succeeded learns the job's verdict from node 0 even when node 0's launcher exits the
// moment it has answered. Before, node 1 asked node 0's store for failures after saying it had
// ended, which raced with node 0's exit and turned a successful job into "the launchers' restart
// agreement is gone" on node 1 (seen in CI).
#include "app/commands/launch/launch_rendezvous.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "tests/dist/multi_process.h"

namespace trainer {
namespace {

LaunchArgs node_args(int node_rank, int port) {
  LaunchArgs a;
  a.nproc_per_node = 1;
  a.nnodes = 2;
  a.node_rank = node_rank;
  a.master_port = port;
  return a;
}

TEST(LauncherRendezvous, EveryNodeLearnsTheVerdictBeforeNodeZeroLeaves) {
  for (int round = 0; round < 5; ++round) {
    const int port = testing::free_port(2);  // MASTER_PORT + 1 serves the launchers
    const std::chrono::milliseconds timeout(10000);
    auto node0 = std::make_unique<LauncherRendezvous>(node_args(0, port), timeout);
    std::string verdict1 = "(not set)";
    std::thread node1([&] {
      LauncherRendezvous r(node_args(1, port), timeout);
      r.begin(0, "", "");
      verdict1 = r.finish(0);
    });
    node0->begin(0, "job", "");
    const std::string verdict0 = node0->finish(0);
    node0.reset();  // node 0's launcher exits as soon as it has its answer
    node1.join();
    EXPECT_EQ(verdict0, "") << "round " << round;
    EXPECT_EQ(verdict1, "") << "round " << round;
  }
}

// Node 0's rank fails while node 1 waits for the verdict: node 0 restarts or exits without one, and
// node 1 must answer with that failure (waiting for the verdict alone would end, after twice the
// timeout, with "node 0 gave no verdict").
TEST(LauncherRendezvous, AFailureOnNodeZeroEndsTheWaitForTheVerdict) {
  const int port = testing::free_port(2);
  const std::chrono::milliseconds timeout(20000);
  LauncherRendezvous node0(node_args(0, port), timeout);
  std::string verdict1 = "(not set)";
  std::thread node1([&] {
    LauncherRendezvous r(node_args(1, port), timeout);
    r.begin(0, "", "");
    verdict1 = r.finish(0);
  });
  node0.begin(0, "job", "");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // node 1 is waiting by now
  node0.report_failure(0, "rank 0 failed");
  node1.join();
  EXPECT_EQ(verdict1, "rank 0 failed");
}

}  // namespace
}  // namespace trainer
