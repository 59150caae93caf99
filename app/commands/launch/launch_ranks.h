#pragma once
// One attempt of `trainer launch` (app/commands/launch/launch_command.h): starts this node's ranks, relays
// their output with a "[rank R] " prefix, forwards stop signals sent to the launcher, and when a rank fails
// stops the others (SIGTERM, then SIGKILL after a grace) and says so at once. The caller decides
// whether to start another attempt (--max-restarts).
#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "dist/process_env.h"

namespace trainer {

// Cuts a byte stream into lines and prefixes each; a partial line waits for its end (or for flush()).
class LinePrefixer {
 public:
  explicit LinePrefixer(std::string prefix) : prefix_(std::move(prefix)) {}
  // Returns the complete lines of `data` (with what was pending), each prefixed and '\n'-terminated.
  std::string feed(const char* data, size_t n);
  // Returns the pending partial line, prefixed and terminated, or "" when nothing is pending.
  std::string flush();
  // The last non-blank complete (or flushed) line, without prefix and newline.
  const std::string& last_line() const { return last_line_; }
  // The last line holding "error:" (the trainer's own error line, which context lines may follow);
  // the last line when there is none.
  const std::string& error_line() const { return error_line_.empty() ? last_line_ : error_line_; }
  // What followed kRunDirMarker on the first line that held it ("" while none did): the run directory
  // that rank 0 of `trainer train` announces (app/train/run_start.cpp) before it writes any checkpoint.
  const std::string& run_dir() const { return run_dir_; }
  static constexpr const char* kRunDirMarker = ", run directory: ";

 private:
  void take_line(const std::string& line, std::string* out);
  std::string prefix_;
  std::string pending_;
  std::string last_line_;
  std::string error_line_;
  std::string run_dir_;
};

// Installs the launcher's handlers for SIGINT/SIGTERM/SIGHUP/SIGCHLD (and ignores SIGPIPE) for its
// lifetime. It spans every attempt, so that a stop signal sent between two attempts is not lost.
class LauncherSignals {
 public:
  LauncherSignals();
  ~LauncherSignals();
  LauncherSignals(const LauncherSignals&) = delete;
  LauncherSignals& operator=(const LauncherSignals&) = delete;
};

struct RankSpec {
  int rank = 0;  // global rank, for the prefix and the messages
  EnvMap env;
};

struct AttemptSpec {
  std::string program;               // the executable every rank runs
  std::vector<std::string> command;  // its arguments (argv[1..])
  std::vector<RankSpec> ranks;       // this node's ranks, in local rank order
  std::chrono::milliseconds stop_grace{30000};
  std::string start_line;  // the line to print before the ranks' pids (without "trainer launch: ")
  // Several nodes (app/commands/launch/launch_rendezvous.h): told of this node's first failed rank, and asked
  // about twice a second whether another node's failed ("" while none did), which stops this node's ranks.
  std::function<void(const std::string&)> report_failure;
  std::function<std::string()> remote_failure;
};

struct AttemptOutcome {
  int stop_signal = 0;         // the first SIGINT/SIGTERM/SIGHUP the launcher received; 0: none
  int failed_rank = -1;        // the first rank that failed on its own (not stopped by us); -1: none
  int failed_status = 0;       // its waitpid status
  std::string failed_error;    // its last error line on stderr ("" if it printed nothing)
  std::vector<int> killed;     // ranks SIGKILLed because they outlived the grace after a failure
  std::string run_dir;         // the run directory a rank announced on stdout (LinePrefixer::run_dir)
  std::string remote_failure;  // another node's failure that stopped this node's ranks ("" if none)
  std::vector<std::pair<int, int>> statuses;  // (rank, waitpid status) of every rank
};

// Runs one attempt to its end: every rank has exited and its output is relayed. Needs a live
// LauncherSignals. Throws std::runtime_error when a rank cannot be started (the ones started are
// killed first).
AttemptOutcome run_attempt(const AttemptSpec& spec);

// Writes all of `s` to `fd` with write(2), retrying after EINTR; gives up quietly once `fd` is gone
// (a closed terminal must not stop the launcher from supervising its ranks).
void write_fully(int fd, const std::string& s);

// The first SIGINT/SIGTERM/SIGHUP the launcher received (0: none); needs a live LauncherSignals.
int launcher_stop_signal();

// "exit status 3", "killed by signal 9 (Killed)".
std::string describe_exit(int status);

}  // namespace trainer
