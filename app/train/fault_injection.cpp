#include "app/train/fault_injection.h"

#include <cstdio>
#include <cstdlib>

namespace trainer {
namespace {

StallHook stall_hook_from_env() {
  StallHook hook;
  if (const char* stall = std::getenv("TRAINER_TEST_STALL"))
    std::sscanf(stall, "%d:%lld:%lf", &hook.rank, &hook.step, &hook.seconds);
  return hook;
}

InfGradHook inf_grad_hook_from_env() {
  InfGradHook hook;
  if (const char* at = std::getenv("TRAINER_TEST_INF_GRAD"))
    std::sscanf(at, "%d:%lld", &hook.rank, &hook.step);
  return hook;
}

SignalHook signal_hook_from_env() {
  SignalHook hook;
  if (const char* at = std::getenv("TRAINER_TEST_SIGTERM_AT_STEP")) hook.step = std::atoll(at);
  if (const char* signal = std::getenv("TRAINER_TEST_SIGNAL"); signal && std::atoi(signal) > 0)
    hook.signal = std::atoi(signal);
  hook.twice = std::getenv("TRAINER_TEST_SIGNAL_TWICE") != nullptr;
  hook.in_final_eval = std::getenv("TRAINER_TEST_SIGTERM_IN_FINAL_EVAL") != nullptr;
  // A launcher's restart must not meet the same hook again, or it would fail the same way forever.
  if (const char* restart = std::getenv("TRAINER_RESTART_COUNT"); restart && std::atoi(restart) > 0)
    hook.step = -1, hook.in_final_eval = false;
  if (const char* rank = std::getenv("TRAINER_TEST_SIGNAL_RANK")) {
    const char* mine = std::getenv("RANK");
    if (!mine || std::atoi(mine) != std::atoi(rank)) hook.step = -1, hook.in_final_eval = false;
  }
  return hook;
}

EpochStepsHook epoch_steps_hook_from_env() {
  EpochStepsHook hook;
  int rank = -1;
  long long delta = 0;
  if (const char* at = std::getenv("TRAINER_TEST_EPOCH_STEPS");
      at && std::sscanf(at, "%d:%lld", &rank, &delta) == 2)
    hook.rank = rank, hook.delta = delta;
  return hook;
}

FullDiskHook full_disk_hook_from_env() {
  const char* names = std::getenv("TRAINER_TEST_FULL_DISK");
  return names ? full_disk_hook_from(names) : FullDiskHook{};
}

}  // namespace

FaultInjection fault_injection_from_env() {
  FaultInjection faults{stall_hook_from_env(), inf_grad_hook_from_env(), signal_hook_from_env(),
                        full_disk_hook_from_env()};
  if (const char* at = std::getenv("TRAINER_TEST_CRASH_BEFORE_RENAME"))
    faults.crash_before_rename_step = std::atoll(at);
  faults.epoch_steps = epoch_steps_hook_from_env();
  return faults;
}

}  // namespace trainer
