// On a terminal, train.log still gets every periodic line (the console redraws a status line).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>

#include "run_faults.h"

namespace {

namespace fs = std::filesystem;
using namespace trainer::testing;

// ---- 2. on a terminal, the periodic phase lines still reach train.log (and the console)

// Runs the trainer with a pseudo-terminal as its stdin, stdout and stderr; returns what it printed.
RunResult run_trainer_on_a_terminal(const std::string& args) {
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY);
  if (master < 0 || ::grantpt(master) != 0 || ::unlockpt(master) != 0) return {-1, "no pseudo-terminal"};
  const std::string terminal = ::ptsname(master);
  const std::string command = trainer_binary() + " " + args;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setsid();
    const int fd = ::open(terminal.c_str(), O_RDWR);  // becomes the controlling terminal
    if (fd < 0) ::_exit(126);
    ::dup2(fd, 0);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::close(master);
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  std::string out;
  char buf[4096];
  for (;;) {  // until the terminal closes (EIO once the trainer has exited)
    const ssize_t n = ::read(master, buf, sizeof buf);
    if (n > 0) out.append(buf, static_cast<size_t>(n));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
  }
  ::close(master);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST_F(RunFaults, PhaseLinesReachTrainLogOnATerminal) {
  const RunResult r =
      run_trainer_on_a_terminal("train " + write_config() + " --set train.run_dir=" + run_dir("tty"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string log = read_file(dir_ / "tty/train.log");
  for (const char* step : {"epoch 1/2 step 4/16", "epoch 1/2 step 8/16", "epoch 2/2 step 16/16"}) {
    const size_t at = log.find(step);
    ASSERT_NE(at, std::string::npos) << step << "\n" << log;
    const std::string line = log.substr(at, log.find('\n', at) - at);
    EXPECT_NE(line.find("| forward"), std::string::npos) << line;
    EXPECT_EQ(line.find('\r'), std::string::npos) << line;  // no terminal redraws in the file
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
  }
}

}  // namespace
