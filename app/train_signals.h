#pragma once
// SIGINT/SIGTERM/SIGHUP during training: the first one asks the loop to finish its step, write a
// checkpoint and exit with 128 + the signal. A repeat within a second is the same request delivered
// twice (to the launcher's whole process group, and forwarded by the launcher); a later one kills at
// once. SIGHUP (a closed terminal) is left alone when it was ignored at start (nohup).
#include <csignal>

namespace trainer {

void install_stop_handlers();
// 0 while no stop was requested, else the signal number.
int stop_requested();

// Test hooks, to exercise the signal path exactly: TRAINER_TEST_SIGTERM_AT_STEP=STEP delivers SIGTERM
// (or TRAINER_TEST_SIGNAL=N) to this process after that step; TRAINER_TEST_SIGNAL_TWICE delivers it
// twice (one request delivered twice); TRAINER_TEST_SIGNAL_RANK=R only on the rank whose RANK is R.
// TRAINER_TEST_SIGTERM_IN_FINAL_EVAL delivers it as the final evaluation starts (after the last step).
// None of them fires after a restart by `trainer launch --max-restarts` (TRAINER_RESTART_COUNT > 0).
// step -1: none.
struct SignalHook {
  long long step = -1;
  int signal = SIGTERM;
  bool twice = false;
  bool in_final_eval = false;
};
SignalHook signal_hook_from_env();

}  // namespace trainer
