#pragma once
// A process a test starts and must not outlive: posix_spawn with extra environment variables, output to
// a log file, and a destructor that ends it (SIGTERM, then SIGKILL after a grace period), so a failed
// assertion never leaves a Prometheus server or a trainer rank behind.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace trainer::testing {

class ChildProcess {
 public:
  using Clock = std::chrono::steady_clock;

  // argv[0] is the executable's path; env holds "NAME=value" entries added to (and overriding) ours.
  ChildProcess(const std::vector<std::string>& argv, const std::string& log_path,
               const std::vector<std::string>& env = {}) {
    std::vector<std::string> env_strings = env;
    for (char** e = environ; *e; ++e) {
      const std::string entry = *e;
      const std::string name = entry.substr(0, entry.find('='));
      bool overridden = false;
      for (const auto& x : env) overridden |= x.rfind(name + "=", 0) == 0;
      if (!overridden) env_strings.push_back(entry);
    }
    std::vector<char*> args, envp;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    for (const auto& e : env_strings) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    if (posix_spawn(&pid_, argv.at(0).c_str(), &actions, nullptr, args.data(), envp.data()) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
  }
  ~ChildProcess() { stop(std::chrono::seconds(10)); }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  bool started() const { return pid_ > 0; }
  bool running() { return started() && !poll().has_value(); }

  // The exit code (128 + signal when killed by one) once the process has ended; nullopt before.
  std::optional<int> poll() {
    if (!exit_code_ && pid_ > 0) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_)
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    return exit_code_;
  }

  // Waits until the process ends or the deadline passes.
  std::optional<int> wait_until(Clock::time_point deadline) {
    while (!poll() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return poll();
  }

  void signal(int sig) {
    if (running()) ::kill(pid_, sig);
  }

  // SIGTERM, then SIGKILL when it has not ended within `grace`; returns the exit code.
  std::optional<int> stop(std::chrono::milliseconds grace) {
    if (!running()) return exit_code_;
    ::kill(pid_, SIGTERM);
    if (auto code = wait_until(Clock::now() + grace)) return code;
    ::kill(pid_, SIGKILL);
    return wait_until(Clock::now() + std::chrono::seconds(10));
  }

 private:
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
};

}  // namespace trainer::testing
