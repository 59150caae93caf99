// The heartbeat: what each rank reports through the store, and how a failed collective's message reads
// it (alive elsewhere, behind, dead).
#include "dist/heartbeat.h"

#include <gtest/gtest.h>

#include <thread>

#include "dist/error.h"
#include "tests/dist/multi_process.h"

namespace trainer {
namespace {

using namespace std::chrono_literals;
using testing::ThreadWorld;

TEST(Heartbeat, DescribesWhereEachRankIs) {
  ThreadWorld world(3);
  Heartbeat r0(world.client(), 0, 3, 100ms), r1(world.client(), 1, 3, 100ms), r2(world.client(), 2, 3, 100ms);
  r0.set_step(12);
  r0.set_phase("allreduce_exposed");
  r1.set_step(12);
  r1.set_phase("data_wait");
  r2.set_step(11);
  r2.set_phase("backward");
  std::this_thread::sleep_for(400ms);  // a few beats
  const std::string d = r0.describe_ranks();
  EXPECT_NE(d.find("every 0.1 s"), std::string::npos) << d;
  EXPECT_NE(d.find("rank 0 (this rank): step 12, in allreduce_exposed for"), std::string::npos) << d;
  EXPECT_NE(d.find("rank 1: step 12, in data_wait for"), std::string::npos) << d;
  // Time in the phase counts from set_phase (400 ms ago at least), not from the last beat (<= 100 ms).
  const size_t at = d.find("data_wait for ");
  ASSERT_NE(at, std::string::npos) << d;
  EXPECT_GE(std::stod(d.substr(at + 14)), 0.3) << d;
  EXPECT_NE(d.find(": alive, but not in a collective"), std::string::npos) << d;
  EXPECT_NE(d.find("rank 2: step 11, in backward for"), std::string::npos) << d;
  EXPECT_NE(d.find(": 1 step(s) behind"), std::string::npos) << d;
  EXPECT_EQ(d.find("died"), std::string::npos) << d;
}

TEST(Heartbeat, ARankThatStoppedReportingIsCalledDeadOrFrozen) {
  ThreadWorld world(2);
  Heartbeat r0(world.client(), 0, 2, 100ms);
  {
    Heartbeat r1(world.client(), 1, 2, 100ms);
    r1.set_step(7);
    r1.set_phase("backward");
    std::this_thread::sleep_for(250ms);
  }                                     // rank 1 stops reporting, as a killed or frozen process does
  std::this_thread::sleep_for(1600ms);  // beyond 3 intervals + 1 s
  const std::string d = r0.describe_ranks();
  EXPECT_NE(d.find("rank 1: no report for"), std::string::npos) << d;
  EXPECT_NE(d.find("(last: step 7, backward): the process died or is frozen"), std::string::npos) << d;
}

TEST(Heartbeat, ARankThatNeverReportedAndAStoreThatIsGone) {
  auto world = std::make_unique<ThreadWorld>(2);
  Heartbeat r0(world->client(), 0, 2, 100ms);
  const std::string d = r0.describe_ranks(500ms);
  EXPECT_NE(d.find("rank 1: no report (it never got past start-up"), std::string::npos) << d;
  world.reset();  // rank 0's store server goes away
  const std::string gone = r0.describe_ranks(500ms);
  EXPECT_NE(gone.find("the store cannot be read"), std::string::npos) << gone;
}

TEST(Heartbeat, TheDescriptionIsRecordedOnlyWhenAnExceptionLeavesTheScope) {
  ThreadWorld world(1);
  Heartbeat r0(world.client(), 0, 1, 100ms);
  r0.set_phase("checkpoint");
  std::this_thread::sleep_for(250ms);  // published
  { DescribeRanksOnFailure quiet(&r0); }
  EXPECT_EQ(failure_context(), "");
  try {
    DescribeRanksOnFailure guard(&r0);
    throw DistError("all_reduce #3 timed out");
  } catch (const DistError&) {
  }
  EXPECT_NE(failure_context().find("rank 0 (this rank): step 0, in checkpoint"), std::string::npos)
      << failure_context();
}

}  // namespace
}  // namespace trainer
