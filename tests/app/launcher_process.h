#pragma once
// `trainer launch` run from a test as a user runs it: the launcher as a child process whose output a
// thread collects, and what the launcher tests check about the ranks it started.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "app/common/c_string_array.h"
#include "app/trainer_process.h"
#include "test_ports.h"

namespace trainer::testing {

// The launcher as a child of the test, its stdout and stderr read into `output` by a thread. With
// another `command` (`train`), any trainer subcommand running in the background.
class Launcher {
  using Clock = std::chrono::steady_clock;

 public:
  // `env`: "NAME=value" entries added to (or replacing those of) the test's environment.
  explicit Launcher(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
                    const std::string& command = "launch") {
    int fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    std::vector<std::string> argv_s{trainer_binary(), command};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    CStringArray argv(std::move(argv_s));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    std::vector<std::string> env_s = env;
    for (char** e = environ; *e; ++e) {
      const std::string entry = *e;
      const std::string name = entry.substr(0, entry.find('=') + 1);
      bool replaced = false;
      for (const std::string& mine : env) replaced |= mine.rfind(name, 0) == 0;
      if (!replaced) env_s.push_back(entry);
    }
    CStringArray envp(std::move(env_s));
    EXPECT_EQ(::posix_spawn(&pid_, argv.data()[0], &fa, nullptr, argv.data(), envp.data()), 0);
    posix_spawn_file_actions_destroy(&fa);
    ::close(fds[1]);
    reader_ = std::thread([this, fd = fds[0]] {
      char buf[4096];
      for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) {
        std::lock_guard<std::mutex> lock(mu_);
        output_.append(buf, static_cast<size_t>(n));
      }
      ::close(fd);
    });
  }
  ~Launcher() {
    if (!exited_) {
      // A test that failed early leaves a running launcher: SIGTERM first, which it forwards to its
      // ranks and waits for, so that they do not outlive the test (holding the output pipe the reader
      // waits on); SIGKILL after 5 s.
      ::kill(pid_, SIGTERM);
      bool reaped = false;
      for (int i = 0; i < 100 && !reaped; ++i) {
        reaped = ::waitpid(pid_, nullptr, WNOHANG) == pid_;
        if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (!reaped) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
      }
      reader_.join();
    }
  }
  pid_t pid() const { return pid_; }
  std::string output() {
    std::lock_guard<std::mutex> lock(mu_);
    return output_;
  }
  bool wait_for_output(const std::string& text, double seconds) {
    for (const auto end = Clock::now() + std::chrono::duration<double>(seconds); Clock::now() < end;) {
      if (output().find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  // The exit code (128 + signal when killed), or -1 when it is still running after `seconds`.
  int wait_exit(double seconds) {
    for (const auto end = Clock::now() + std::chrono::duration<double>(seconds); Clock::now() < end;) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        reader_.join();
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }
  // The ranks' pids from the launcher's start line.
  std::vector<pid_t> rank_pids() {
    std::vector<pid_t> pids;
    const std::string out = output();
    const std::regex re("rank [0-9]+ pid ([0-9]+)");
    for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it)
      pids.push_back(static_cast<pid_t>(std::stol((*it)[1])));
    return pids;
  }

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
  std::mutex mu_;
  std::string output_;
  std::thread reader_;
};

// A TCP port nothing listens on now, reserved for this test process (tests/test_ports.h), for the
// ranks' rendezvous.
inline int free_ephemeral_port() { return reserve_port(); }

inline void expect_gone(const std::vector<pid_t>& pids) {
  for (pid_t p : pids) EXPECT_NE(::kill(p, 0), 0) << "rank pid " << p << " still exists";
}

// A fresh directory per test (removed afterwards), and the launcher with /bin/sh as its ranks
// (TRAINER_TEST_LAUNCH_PROGRAM), each rank running the same script: fast, and exact about which rank
// does what ($RANK, $TRAINER_RESTART_COUNT).
class LauncherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("trainer_launcher_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // `trainer launch FLAGS -- -c SCRIPT` with /bin/sh in place of the trainer.
  static std::vector<std::string> shell_ranks(std::vector<std::string> flags, const std::string& script) {
    flags.insert(flags.end(), {"--", "-c", script});
    return flags;
  }
  static std::vector<std::string> shell_env(const std::string& grace_ms = "") {
    std::vector<std::string> env{"TRAINER_TEST_LAUNCH_PROGRAM=/bin/sh"};
    if (!grace_ms.empty()) env.push_back("TRAINER_TEST_LAUNCH_STOP_GRACE_MS=" + grace_ms);
    return env;
  }
  std::filesystem::path dir_;
};

}  // namespace trainer::testing
