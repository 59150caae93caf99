// fault_injection_from_env: every TRAINER_TEST_* hook of the training path, read once; all off by default.
#include "app/train/fault_injection.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "tests/app/trainer_process.h"

namespace trainer {
namespace {

using trainer::testing::ScopedEnv;

TEST(FaultInjection, EveryHookIsOffWithoutItsVariable) {
  const ScopedEnv a("TRAINER_TEST_STALL"), b("TRAINER_TEST_INF_GRAD"), c("TRAINER_TEST_SIGTERM_AT_STEP"),
      d("TRAINER_TEST_SIGTERM_IN_FINAL_EVAL"), e("TRAINER_TEST_CRASH_BEFORE_RENAME"),
      f("TRAINER_TEST_FULL_DISK"), g("TRAINER_TEST_EPOCH_STEPS");
  ::unsetenv("TRAINER_TEST_STALL");
  ::unsetenv("TRAINER_TEST_INF_GRAD");
  ::unsetenv("TRAINER_TEST_SIGTERM_AT_STEP");
  ::unsetenv("TRAINER_TEST_SIGTERM_IN_FINAL_EVAL");
  ::unsetenv("TRAINER_TEST_CRASH_BEFORE_RENAME");
  ::unsetenv("TRAINER_TEST_FULL_DISK");
  ::unsetenv("TRAINER_TEST_EPOCH_STEPS");
  const FaultInjection faults = fault_injection_from_env();
  EXPECT_EQ(faults.stall.rank, -1);
  EXPECT_EQ(faults.inf_grad.rank, -1);
  EXPECT_EQ(faults.signal.step, -1);
  EXPECT_FALSE(faults.signal.in_final_eval);
  EXPECT_EQ(faults.crash_before_rename_step, -1);
  EXPECT_TRUE(faults.full_disk.names.empty());
  EXPECT_EQ(faults.epoch_steps.extra_steps(1), 0);
}

TEST(FaultInjection, ReadsEachHookOnce) {
  const ScopedEnv stall("TRAINER_TEST_STALL", "1:5:2.5"), inf("TRAINER_TEST_INF_GRAD", "0:3"),
      at("TRAINER_TEST_SIGTERM_AT_STEP", "7"), signal("TRAINER_TEST_SIGNAL", "2"),
      crash("TRAINER_TEST_CRASH_BEFORE_RENAME", "12"), restart("TRAINER_RESTART_COUNT"),
      rank("TRAINER_TEST_SIGNAL_RANK"), full_disk("TRAINER_TEST_FULL_DISK", "summary.json,train.log"),
      epoch_steps("TRAINER_TEST_EPOCH_STEPS", "1:3");
  ::unsetenv("TRAINER_RESTART_COUNT");
  ::unsetenv("TRAINER_TEST_SIGNAL_RANK");
  const FaultInjection faults = fault_injection_from_env();
  EXPECT_EQ(faults.stall.rank, 1);
  EXPECT_EQ(faults.stall.step, 5);
  EXPECT_EQ(faults.stall.seconds, 2.5);
  EXPECT_EQ(faults.inf_grad.rank, 0);
  EXPECT_EQ(faults.inf_grad.step, 3);
  EXPECT_EQ(faults.signal.step, 7);
  EXPECT_EQ(faults.signal.signal, 2);
  EXPECT_EQ(faults.crash_before_rename_step, 12);
  EXPECT_EQ(faults.full_disk.names, (std::set<std::string>{"summary.json", "train.log"}));
  EXPECT_EQ(faults.epoch_steps.extra_steps(1), 3);  // rank 1 claims 3 more steps
  EXPECT_EQ(faults.epoch_steps.extra_steps(0), 0);
}

TEST(FaultInjection, ARestartedRunMeetsNoSignalHook) {
  const ScopedEnv at("TRAINER_TEST_SIGTERM_AT_STEP", "7"), restart("TRAINER_RESTART_COUNT", "1");
  EXPECT_EQ(fault_injection_from_env().signal.step, -1);
}

}  // namespace
}  // namespace trainer
