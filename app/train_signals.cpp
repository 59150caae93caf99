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
  // A write past RLIMIT_FSIZE must fail with EFBIG (and be reported) instead of killing the process.
  std::signal(SIGXFSZ, SIG_IGN);
}

int stop_requested() { return g_stop_signal.load(); }

}  // namespace trainer
