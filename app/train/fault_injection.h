#pragma once
// The test hooks of the training path (TRAINER_TEST_* environment variables), read once at start-up
// into one value that run_training passes to the few places that act on them: the hot path tests a
// member, never the environment. Each hook is off by default (step or rank -1, no names).
#include <csignal>

#include "metrics/output_file.h"

namespace trainer {

// TRAINER_TEST_STALL="RANK:STEP:SECONDS": that rank waits in data_wait before that step (a stuck data
// loader), so the others' collective times out.
struct StallHook {
  int rank = -1;
  long long step = -1;
  double seconds = 0;
};

// TRAINER_TEST_INF_GRAD="RANK:STEP": on that rank, at that step (1-based, as the log counts), the first
// parameter's gradient becomes inf after the all-reduce, as if only this rank had overflowed; the ranks
// must still skip that step together. Eager steps only.
struct InfGradHook {
  int rank = -1;
  long long step = -1;
};

// The signal path, exercised exactly: TRAINER_TEST_SIGTERM_AT_STEP=STEP delivers SIGTERM (or
// TRAINER_TEST_SIGNAL=N) to this process after that step; TRAINER_TEST_SIGNAL_TWICE delivers it twice
// (one request delivered twice); TRAINER_TEST_SIGNAL_RANK=R only on the rank whose RANK is R.
// TRAINER_TEST_SIGTERM_IN_FINAL_EVAL delivers it as the final evaluation starts (after the last step).
// None of them fires after a restart by `trainer launch --max-restarts` (TRAINER_RESTART_COUNT > 0).
struct SignalHook {
  long long step = -1;
  int signal = SIGTERM;
  bool twice = false;
  bool in_final_eval = false;
};

// TRAINER_TEST_EPOCH_STEPS="RANK:DELTA": that rank claims DELTA more steps per epoch than it will run, so
// check_epoch_steps (dist/consistency.h) can be seen stopping real ranks; the loop itself is unchanged.
struct EpochStepsHook {
  int rank = -1;
  long long delta = 0;
  // The steps `r` claims beyond those it will run.
  long long extra_steps(int r) const { return r == rank ? delta : 0; }
};

struct FaultInjection {
  StallHook stall;
  InfGradHook inf_grad;
  SignalHook signal;
  FullDiskHook full_disk;  // TRAINER_TEST_FULL_DISK (metrics/output_file.h)
  // TRAINER_TEST_CRASH_BEFORE_RENAME=STEP: SIGKILL once that step's checkpoint is written but not yet
  // renamed (app/run/checkpoint.h).
  long long crash_before_rename_step = -1;
  EpochStepsHook epoch_steps;
};

// Reads every hook above from the environment; called once, as the run starts.
FaultInjection fault_injection_from_env();

}  // namespace trainer
