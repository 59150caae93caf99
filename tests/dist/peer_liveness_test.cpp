// Dead-peer detection for communicators that cannot see a dead peer (NCCL): the decision from heartbeat
// records on this rank's clock (PeerLiveness, with made-up times), and reading real heartbeats through
// a store (PeerWatch).
#include "dist/peer_liveness.h"

#include <gtest/gtest.h>

#include <thread>

#include "dist/heartbeat.h"
#include "tests/dist/multi_process.h"

namespace trainer {
namespace {

using namespace std::chrono_literals;
using testing::ThreadWorld;
using Clock = PeerLiveness::Clock;
using Records = std::vector<std::optional<std::string>>;

TEST(PeerLiveness, ARecordThatKeepsChangingIsAlive) {
  PeerLiveness l(0, 2, 4s);
  const auto t0 = Clock::now();
  for (int i = 0; i < 20; ++i)
    l.observe({"1 0 0 a", std::to_string(1000 * i) + " 5 0 backward"}, t0 + i * 1s);
  EXPECT_TRUE(l.silent(t0 + 20s).empty());
}

TEST(PeerLiveness, ARecordUnchangedForLongerThanTheLimitNamesTheRankAndItsLastReport) {
  PeerLiveness l(0, 3, 4s);
  const auto t0 = Clock::now();
  for (int i = 0; i <= 6; ++i)
    l.observe({std::to_string(i) + " 9 0 x", "500 812 20 backward", std::to_string(i) + " 9 0 y"},
              t0 + i * 1s);
  EXPECT_TRUE(l.silent(t0 + 4s).empty());  // not beyond the limit yet
  const auto s = l.silent(t0 + 6s);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].rank, 1);
  EXPECT_EQ(s[0].silent_for, 6s);
  EXPECT_EQ(s[0].last_report, "step 812, backward");
  const std::string d = describe_silent_peers(s);
  EXPECT_EQ(
      d,
      "rank 1 stopped reporting: its heartbeat has not changed for 6.0 s (last report: step 812, backward)");
}

TEST(PeerLiveness, NeverJudgesItselfOrARankThatNeverReported) {
  PeerLiveness l(1, 3, 1s);
  const auto t0 = Clock::now();
  l.observe({std::nullopt, "1 0 0 frozen", "7 0 0 x"}, t0);
  l.observe({std::nullopt, "1 0 0 frozen", "8 0 0 x"}, t0 + 10s);
  EXPECT_TRUE(l.silent(t0 + 10s).empty());  // rank 0 absent, rank 1 is this rank, rank 2 alive
}

TEST(PeerLiveness, AnUnreadableStoreMakesRankZeroTheSilentOneAndRecoveryClearsIt) {
  PeerLiveness l(1, 3, 4s);
  const auto t0 = Clock::now();
  l.observe({"1 3 0 forward", "1 3 0 forward", "1 3 0 forward"}, t0);
  l.observe_store_failure("connection closed by peer", t0 + 1s);
  l.observe_store_failure("connection closed by peer", t0 + 3s);
  EXPECT_TRUE(l.silent(t0 + 5s).empty());  // failing for 4 s: not beyond the limit
  const auto s = l.silent(t0 + 6s);
  ASSERT_EQ(s.size(), 1u);  // only rank 0: the others cannot be judged without the store
  EXPECT_EQ(s[0].rank, 0);
  const std::string d = describe_silent_peers(s);
  EXPECT_NE(d.find("rank 0 cannot be reached: its rendezvous store has not answered for 5.0 s "
                   "(connection closed by peer) (last report: step 3, forward)"),
            std::string::npos)
      << d;
  l.observe({"2 3 0 forward", "2 3 0 forward", "2 3 0 forward"}, t0 + 7s);
  EXPECT_TRUE(l.silent(t0 + 7s).empty());
  // Rank 0 itself never reports itself through the store's failure.
  PeerLiveness zero(0, 2, 1s);
  zero.observe_store_failure("x", t0);
  EXPECT_TRUE(zero.silent(t0 + 10s).empty());
}

TEST(PeerWatch, NamesARankWhoseHeartbeatStoppedAndNotALivingOne) {
  ThreadWorld world(3);
  Heartbeat h0(world.client(), 0, 3, 100ms), h2(world.client(), 2, 3, 100ms);
  auto h1 = std::make_unique<Heartbeat>(world.client(), 1, 3, 100ms);
  h1->set_step(41);
  h1->set_phase("backward");
  auto watch_store = world.client();
  PeerWatch watch(*watch_store, 0, 3, 500ms, 100ms);
  for (int i = 0; i < 8; ++i) {  // all alive for 0.8 s
    EXPECT_TRUE(watch.poll(Clock::now()).empty());
    std::this_thread::sleep_for(100ms);
  }
  h1.reset();  // rank 1 stops reporting, as a killed process does
  std::vector<PeerLiveness::Silent> silent;
  const auto start = Clock::now();
  while (silent.empty() && Clock::now() - start < 5s) {
    std::this_thread::sleep_for(100ms);
    silent = watch.poll(Clock::now());
  }
  ASSERT_EQ(silent.size(), 1u);
  EXPECT_EQ(silent[0].rank, 1);
  EXPECT_EQ(silent[0].last_report, "step 41, backward");
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_GT(took, 0.4);
  EXPECT_LT(took, 2.0);
}

TEST(PeerWatch, NamesRankZeroWhenItsStoreIsGone) {
  auto world = std::make_unique<ThreadWorld>(2);
  auto h1 = std::make_unique<Heartbeat>(world->client(), 1, 2, 100ms);
  auto h0 = std::make_unique<Heartbeat>(world->client(), 0, 2, 100ms);
  auto watch_store = world->client();
  PeerWatch watch(*watch_store, 1, 2, 300ms, 50ms);
  EXPECT_TRUE(watch.poll(Clock::now()).empty());
  h0.reset();
  h1.reset();
  world.reset();  // rank 0's process, and with it the store, is gone
  std::vector<PeerLiveness::Silent> silent;
  const auto start = Clock::now();
  while (silent.empty() && Clock::now() - start < 10s) {
    std::this_thread::sleep_for(50ms);
    silent = watch.poll(Clock::now());
  }
  ASSERT_EQ(silent.size(), 1u);
  EXPECT_EQ(silent[0].rank, 0);
  EXPECT_FALSE(silent[0].store_error.empty());
}

}  // namespace
}  // namespace trainer
