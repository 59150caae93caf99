#include "app/train/train_signals.h"

#include <time.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstdlib>

namespace trainer {
namespace {

std::atomic<int> g_stop_signal{0};
std::atomic<int64_t> g_first_signal_ns{0};
// The pid of the `trainer launch` that started this rank (TRAINER_LAUNCHER_PID), 0 when none did.
pid_t g_launcher_pid = 0;

int64_t monotonic_ns() {  // clock_gettime is async-signal-safe
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// The same stop often arrives twice within milliseconds: a hang-up, `scancel` or a systemd stop signals
// the launcher and its ranks (one process group), and the launcher forwards it as well. A repeat within
// a second is that same request; a later one is the user insisting, and kills at once.
constexpr int64_t kRepeatIsTheSameRequestNs = 1'000'000'000;

extern "C" void on_stop_signal(int sig) {
  const int64_t now = monotonic_ns();
  int none = 0;
  if (g_stop_signal.compare_exchange_strong(none, sig)) {
    g_first_signal_ns.store(now);
    return;
  }
  if (now - g_first_signal_ns.load() < kRepeatIsTheSameRequestNs) return;
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace

void install_stop_handlers() {
  // Only when that launcher is this process's parent, and not passed on to processes this one starts
  // (a trainer started by a rank would take every stop for its launcher's death).
  if (const char* pid = std::getenv("TRAINER_LAUNCHER_PID")) {
    const pid_t launcher = static_cast<pid_t>(std::atol(pid));
    if (launcher == ::getppid()) g_launcher_pid = launcher;
    ::unsetenv("TRAINER_LAUNCHER_PID");
  }
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

std::string stop_signal_origin() {
  if (g_launcher_pid <= 0 || ::getppid() == g_launcher_pid) return "";
  return "the trainer launch that started this rank (pid " + std::to_string(g_launcher_pid) +
         ") is gone, so the kernel sent SIGTERM (PR_SET_PDEATHSIG)";
}

}  // namespace trainer
