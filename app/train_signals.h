#pragma once
// SIGINT/SIGTERM during training: the first one asks the loop to finish its step, write a checkpoint
// and exit; the handler then restores the default action, so a second signal kills at once.
namespace trainer {

void install_stop_handlers();
// 0 while no stop was requested, else the signal number.
int stop_requested();

}  // namespace trainer
