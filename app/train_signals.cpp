#include "app/train_signals.h"

#include <atomic>
#include <csignal>

namespace trainer {
namespace {

std::atomic<int> g_stop_signal{0};

extern "C" void on_stop_signal(int sig) {
  g_stop_signal.store(sig);
  std::signal(sig, SIG_DFL);
}

}  // namespace

void install_stop_handlers() {
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  // A closed terminal (or ssh session) sends SIGHUP, whose default action would kill the run without a
  // checkpoint. Under nohup (SIGHUP ignored when we start) it stays ignored, as the user asked.
  struct sigaction hup {};
  if (sigaction(SIGHUP, nullptr, &hup) == 0 && hup.sa_handler != SIG_IGN) std::signal(SIGHUP, on_stop_signal);
  // A closed reader of our output (`| tee` ended by the same hang-up) must not kill the run before its
  // checkpoint: writes then fail with EPIPE instead.
  std::signal(SIGPIPE, SIG_IGN);
  // A write past RLIMIT_FSIZE must fail with EFBIG (and be reported) instead of killing the process.
  std::signal(SIGXFSZ, SIG_IGN);
}

int stop_requested() { return g_stop_signal.load(); }

}  // namespace trainer
