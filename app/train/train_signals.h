#pragma once
// SIGINT/SIGTERM/SIGHUP during training: the first one asks the loop to finish its step, write a
// checkpoint and exit with 128 + the signal. A repeat within a second is the same request delivered
// twice (to the launcher's whole process group, and forwarded by the launcher); a later one kills at
// once. SIGHUP (a closed terminal) is left alone when it was ignored at start (nohup).
#include <csignal>
#include <string>

namespace trainer {

void install_stop_handlers();
// 0 while no stop was requested, else the signal number.
int stop_requested();
// Where a stop signal came from when no person sent it: "" normally; a sentence when the `trainer
// launch` that started this rank has died (its ranks get SIGTERM then: PR_SET_PDEATHSIG,
// app/commands/launch/launch_ranks.cpp), for the log line that reports the stop.
std::string stop_signal_origin();

}  // namespace trainer
