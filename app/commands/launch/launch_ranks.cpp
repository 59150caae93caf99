#include "app/commands/launch/launch_ranks.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "app/common/c_string_array.h"

namespace trainer {
namespace {

// ---- signals: the handler only writes (signal, si_code, si_pid) into a pipe that the poll loop reads.
// SIGCHLD goes through it too, so ranks that fail milliseconds apart are seen in the order they died.

int g_signal_pipe[2] = {-1, -1};
// The first stop signal (SIGINT/SIGTERM/SIGHUP) received, for waits outside an attempt's poll loop.
volatile sig_atomic_t g_first_stop = 0;
// SIGHUP was ignored when the launcher started (nohup): it stays ignored here and in the ranks.
bool g_hup_ignored = false;
struct sigaction g_old_int {
}, g_old_term{}, g_old_hup{}, g_old_chld{}, g_old_pipe{};

extern "C" void on_launcher_signal(int sig, siginfo_t* info, void*) {
  const int saved = errno;
  const int msg[3] = {sig, info ? info->si_code : SI_USER, info ? static_cast<int>(info->si_pid) : 0};
  if (sig != SIGCHLD && g_first_stop == 0) g_first_stop = sig;
  [[maybe_unused]] ssize_t n = ::write(g_signal_pipe[1], msg, sizeof msg);
  errno = saved;
}

// ---- children ----

struct Child {
  int rank = 0;
  pid_t pid = -1;
  int out_fd = -1;  // read ends of the child's stdout / stderr pipes; -1 once at EOF
  int err_fd = -1;
  LinePrefixer out, err;
  bool running = false;
  int status = 0;  // waitpid status once it has exited

  explicit Child(int r) : rank(r), out(prefix(r)), err(prefix(r)) {}
  static std::string prefix(int r) { return "[rank " + std::to_string(r) + "] "; }
};

bool failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

// The child's side of spawn(), between fork and exec: only async-signal-safe calls (the launcher may
// have other threads). The rank gets SIGTERM when the launcher dies (PR_SET_PDEATHSIG), so a launcher
// killed with SIGKILL leaves no rank training on alone; one whose launcher died before the call took
// effect stops itself. A failed exec reports its errno on `exec_error`.
[[noreturn]] void become_rank(pid_t launcher, const int out[2], const int err[2], int exec_error,
                              const char* exe, char* const* argv, char* const* envp) {
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != launcher) ::_exit(128 + SIGTERM);
  // The pipes' ends are above 2 (the launcher keeps 0-2 open: ensure_standard_fds), so dup2 always
  // makes a new descriptor, without the CLOEXEC of the original.
  const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd < 0 || ::dup2(null_fd, STDIN_FILENO) < 0 || ::dup2(out[1], STDOUT_FILENO) < 0 ||
      ::dup2(err[1], STDERR_FILENO) < 0) {
    const int e = errno;
    [[maybe_unused]] ssize_t n = ::write(exec_error, &e, sizeof e);
    ::_exit(127);
  }
  // Default dispositions (the launcher's handlers write into its own signal pipe); SIGPIPE is ignored
  // in the launcher, not in the ranks; SIGHUP stays ignored in them under nohup.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig)
    if (sig != SIGKILL && sig != SIGSTOP && !(sig == SIGHUP && g_hup_ignored))
      ::sigaction(sig, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::execve(exe, argv, envp);
  const int e = errno;
  [[maybe_unused]] ssize_t n = ::write(exec_error, &e, sizeof e);
  ::_exit(127);
}

// Starts one rank with its stdout/stderr on fresh pipes; stdin is /dev/null (N ranks cannot share it).
// fork + exec rather than posix_spawn: only a child of our own can set PR_SET_PDEATHSIG before exec.
void spawn(Child& c, const std::string& exe, const std::vector<std::string>& command, const EnvMap& env) {
  int out[2] = {-1, -1}, err[2] = {-1, -1}, exec_error[2] = {-1, -1};
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0 || ::pipe2(exec_error, O_CLOEXEC) != 0) {
    const int e = errno;
    for (int fd : {out[0], out[1], err[0], err[1]})
      if (fd >= 0) ::close(fd);
    throw std::runtime_error(std::string("launch: pipe: ") + std::strerror(e));
  }
  std::vector<std::string> argv_s{exe};
  argv_s.insert(argv_s.end(), command.begin(), command.end());
  CStringArray argv(std::move(argv_s));
  std::vector<std::string> env_s;
  for (const auto& [k, v] : env) env_s.push_back(k + "=" + v);
  CStringArray envp(std::move(env_s));

  // No signal handler of the launcher may run in the child before it resets them.
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) become_rank(launcher, out, err, exec_error[1], exe.c_str(), argv.data(), envp.data());
  const int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  ::close(out[1]);
  ::close(err[1]);
  ::close(exec_error[1]);
  int child_errno = 0;
  if (pid > 0) {
    // EOF (0 bytes) once exec has closed the CLOEXEC pipe: the rank is running.
    ssize_t n;
    while ((n = ::read(exec_error[0], &child_errno, sizeof child_errno)) < 0 && errno == EINTR) {
    }
    if (n != static_cast<ssize_t>(sizeof child_errno)) child_errno = 0;
    if (child_errno != 0) ::waitpid(pid, nullptr, 0);
  }
  ::close(exec_error[0]);
  if (pid < 0 || child_errno != 0) {
    ::close(out[0]);
    ::close(err[0]);
    throw std::runtime_error("launch: cannot start rank " + std::to_string(c.rank) + " (" + exe +
                             "): " + std::strerror(pid < 0 ? fork_errno : child_errno));
  }
  c.pid = pid;
  ::fcntl(out[0], F_SETFL, O_NONBLOCK);
  ::fcntl(err[0], F_SETFL, O_NONBLOCK);
  c.out_fd = out[0];
  c.err_fd = err[0];
  c.running = true;
}

void signal_running(std::vector<Child>& children, int sig) {
  for (auto& c : children)
    if (c.running) ::kill(c.pid, sig);
}

// Reads what is available on *fd; at EOF flushes the partial line and closes it.
void pump(int* fd, LinePrefixer& lines, int out_fd) {
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(*fd, buf, sizeof buf);
    if (n > 0) {
      write_fully(out_fd, lines.feed(buf, static_cast<size_t>(n)));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    write_fully(out_fd, lines.flush());
    ::close(*fd);
    *fd = -1;
    return;
  }
}

void pump_both(Child& c) {
  if (c.out_fd >= 0) pump(&c.out_fd, c.out, STDOUT_FILENO);
  if (c.err_fd >= 0) pump(&c.err_fd, c.err, STDERR_FILENO);
}

std::string seconds_text(std::chrono::milliseconds d) {
  const long long ms = d.count();
  return ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

}  // namespace

void write_fully(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // our own output is gone (EPIPE, ...): keep supervising the ranks anyway
    done += static_cast<size_t>(n);
  }
}

// ---- LinePrefixer ----

void LinePrefixer::take_line(const std::string& line, std::string* out) {
  out->append(prefix_).append(line).push_back('\n');
  if (line.find_first_not_of(" \t\r") != std::string::npos) {
    last_line_ = line;
    if (!last_line_.empty() && last_line_.back() == '\r') last_line_.pop_back();
    if (last_line_.find("error:") != std::string::npos) error_line_ = last_line_;
    if (const size_t at = last_line_.find(kRunDirMarker); run_dir_.empty() && at != std::string::npos)
      run_dir_ = last_line_.substr(at + std::strlen(kRunDirMarker));
  }
}

std::string LinePrefixer::feed(const char* data, size_t n) {
  constexpr size_t kMaxPartial = 64 * 1024;  // a line longer than this is cut rather than held forever
  std::string out;
  pending_.append(data, n);
  size_t start = 0;
  for (size_t nl; (nl = pending_.find('\n', start)) != std::string::npos; start = nl + 1)
    take_line(pending_.substr(start, nl - start), &out);
  pending_.erase(0, start);
  if (pending_.size() >= kMaxPartial) {
    take_line(pending_, &out);
    pending_.clear();
  }
  return out;
}

std::string LinePrefixer::flush() {
  std::string out;
  if (!pending_.empty()) take_line(pending_, &out);
  pending_.clear();
  return out;
}

// ---- LauncherSignals ----

namespace {

// A launcher started with 0, 1 or 2 closed would hand those numbers to its pipes, and a rank's dup2
// onto the same number would keep the pipe's CLOEXEC: /dev/null takes them first.
void ensure_standard_fds() {
  for (int fd = 0; fd <= 2; ++fd)
    if (::fcntl(fd, F_GETFD) == -1 && errno == EBADF) ::open("/dev/null", O_RDWR);  // the lowest free number
}

}  // namespace

LauncherSignals::LauncherSignals() {
  ensure_standard_fds();
  if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
    throw std::runtime_error(std::string("launch: pipe: ") + std::strerror(errno));
  struct sigaction sa {};
  sa.sa_sigaction = on_launcher_signal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, &g_old_int);
  ::sigaction(SIGTERM, &sa, &g_old_term);
  // A closed terminal's SIGHUP is forwarded like SIGTERM, so the ranks checkpoint and stop (instead
  // of the launcher dying and the ranks losing the pipes they log to).
  ::sigaction(SIGHUP, nullptr, &g_old_hup);
  g_hup_ignored = g_old_hup.sa_handler == SIG_IGN;
  if (!g_hup_ignored) ::sigaction(SIGHUP, &sa, nullptr);
  sa.sa_flags |= SA_NOCLDSTOP;
  ::sigaction(SIGCHLD, &sa, &g_old_chld);
  // A closed stdout (`| head`) must not kill the launcher while its ranks run.
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ign, &g_old_pipe);
}

LauncherSignals::~LauncherSignals() {
  ::sigaction(SIGINT, &g_old_int, nullptr);
  ::sigaction(SIGTERM, &g_old_term, nullptr);
  ::sigaction(SIGHUP, &g_old_hup, nullptr);
  ::sigaction(SIGCHLD, &g_old_chld, nullptr);
  ::sigaction(SIGPIPE, &g_old_pipe, nullptr);
  ::close(g_signal_pipe[0]);
  ::close(g_signal_pipe[1]);
  g_signal_pipe[0] = g_signal_pipe[1] = -1;
}

// ---- one attempt ----

std::string describe_exit(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "killed by signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
  return "status " + std::to_string(status);
}

namespace {

// One attempt's ranks and its state: the first failure, whether the others are being stopped, and
// the deadlines that follow from that.
class Attempt {
 public:
  explicit Attempt(const AttemptSpec& spec) : spec_(spec) {}

  // Starts every rank; when one cannot start, kills those already started and rethrows.
  void start_ranks() {
    children_.reserve(spec_.ranks.size());
    try {
      for (const RankSpec& r : spec_.ranks) {
        children_.emplace_back(r.rank);
        spawn(children_.back(), spec_.program, spec_.command, r.env);
      }
    } catch (...) {
      signal_running(children_, SIGKILL);
      for (auto& c : children_)
        if (c.running) ::waitpid(c.pid, nullptr, 0);
      throw;
    }
  }

  void announce_pids() const {
    std::string line = "trainer launch: " + spec_.start_line;
    for (const auto& c : children_)
      line += " rank " + std::to_string(c.rank) + " pid " + std::to_string(c.pid) +
              (&c == &children_.back() ? "" : ",");
    write_fully(STDERR_FILENO, line + "\n");
  }

  // True once every rank has exited and its pipes are drained (or the drain's bound has passed).
  bool over() {
    bool any_open = false;
    any_running_ = false;
    for (const auto& c : children_) {
      any_running_ |= c.running;
      any_open |= c.out_fd >= 0 || c.err_fd >= 0;
    }
    if (any_running_) return false;
    // All ranks are gone; what they wrote is still in the pipes. A grandchild holding a pipe open
    // must not keep the launcher alive, hence the bound.
    if (!any_open) return true;
    if (drain_until_ == Clock::time_point{}) drain_until_ = Clock::now() + std::chrono::seconds(1);
    return Clock::now() >= drain_until_;
  }

  void wait_for_events() const {
    std::vector<pollfd> fds{{g_signal_pipe[0], POLLIN, 0}};
    for (const auto& c : children_) {
      if (c.out_fd >= 0) fds.push_back({c.out_fd, POLLIN, 0});
      if (c.err_fd >= 0) fds.push_back({c.err_fd, POLLIN, 0});
    }
    // SIGCHLD wakes the poll; the timeout bounds how late a merged one, or the SIGKILL deadline, is seen.
    if (::poll(fds.data(), fds.size(), 50) < 0 && errno != EINTR)
      throw std::runtime_error(std::string("launch: poll: ") + std::strerror(errno));
  }

  // Reaps the ranks a SIGCHLD names and forwards stop signals to the ranks.
  void handle_signals() {
    for (int msg[3]; ::read(g_signal_pipe[0], msg, sizeof msg) == static_cast<ssize_t>(sizeof msg);) {
      if (msg[0] == SIGCHLD) {
        for (auto& c : children_)
          if (c.running && c.pid == msg[2]) reap(c);
        continue;
      }
      if (outcome_.stop_signal == 0) outcome_.stop_signal = msg[0];
      // A terminal's Ctrl-C (si_code SI_KERNEL) already reached the ranks, which share our process
      // group. A hang-up the kernel sends to us as the session's leader (`ssh -t host trainer launch`)
      // may not have: it is forwarded whatever its origin (a rank takes a repeat within a second as
      // the same request, app/train/train_signals.h).
      if (msg[1] != SI_KERNEL || msg[0] == SIGHUP) signal_running(children_, msg[0]);
    }
  }

  void relay_output() {
    for (auto& c : children_) pump_both(c);
  }

  // SIGCHLDs that arrive together merge into one: this sweep catches those.
  void reap_exited() {
    for (auto& c : children_)
      if (c.running) reap(c);
  }

  // Several nodes: another node's failure stops this node's ranks too (asked twice a second).
  void check_other_nodes() {
    if (!spec_.remote_failure || stopping_after_failure_ || outcome_.stop_signal != 0 || !any_running_ ||
        Clock::now() < next_remote_check_)
      return;
    next_remote_check_ = Clock::now() + std::chrono::milliseconds(500);
    std::string why = spec_.remote_failure();
    if (why.empty()) return;
    outcome_.remote_failure = why;
    start_grace();
    stop_others("another node: " + why + "; stopping this node's ranks");
  }

  // The ranks still running once the grace after a failure has passed are taken as frozen.
  void kill_after_grace() {
    if (!stopping_after_failure_ || killed_ || Clock::now() < kill_at_) return;
    for (const auto& c : children_)
      if (c.running) outcome_.killed.push_back(c.rank);
    if (!outcome_.killed.empty())
      write_fully(STDERR_FILENO, "trainer launch: " + rank_list(outcome_.killed) + " did not exit within " +
                                     seconds_text(spec_.stop_grace) +
                                     " of SIGTERM (frozen?); sending SIGKILL\n");
    signal_running(children_, SIGKILL);
    killed_ = true;
  }

  // Relays what is left, closes what a grandchild kept open and says how every rank ended.
  AttemptOutcome finish() {
    for (auto& c : children_) {
      write_fully(STDOUT_FILENO, c.out.flush());
      write_fully(STDERR_FILENO, c.err.flush());
      if (c.out_fd >= 0) ::close(c.out_fd);
      if (c.err_fd >= 0) ::close(c.err_fd);
      outcome_.statuses.emplace_back(c.rank, c.status);
      if (outcome_.run_dir.empty()) outcome_.run_dir = c.out.run_dir();
    }
    if (first_failed_ >= 0) {
      const Child& c = children_[static_cast<size_t>(first_failed_)];
      outcome_.failed_rank = c.rank;
      outcome_.failed_status = c.status;
      outcome_.failed_error = c.err.error_line();
    }
    return std::move(outcome_);
  }

 private:
  using Clock = std::chrono::steady_clock;

  // Collects c's status if it has exited; the first rank that fails on its own stops the others.
  void reap(Child& c) {
    int status = 0;
    const pid_t r = ::waitpid(c.pid, &status, WNOHANG);
    if (r == 0 || (r < 0 && errno == EINTR)) return;
    c.running = false;
    // A status waitpid could not give (ECHILD) is lost: counted as a failure, never as a success.
    c.status = r == c.pid ? status : (127 << 8);
    if (!failed(c.status) || first_failed_ >= 0 || outcome_.stop_signal != 0 || stopping_after_failure_)
      return;
    first_failed_ = static_cast<int>(&c - children_.data());
    start_grace();
    const std::string failure =
        "rank " + std::to_string(c.rank) + " failed (" + describe_exit(c.status) + ")";
    if (spec_.report_failure) spec_.report_failure(failure);
    bool others = false;
    for (const auto& o : children_) others |= o.running;
    if (!others) return;
    pump_both(c);  // its last lines first, so the cause stands above the launcher's line
    stop_others(failure + "; stopping the others");
  }

  // From now on the ranks get spec_.stop_grace to exit before SIGKILL.
  void start_grace() {
    stopping_after_failure_ = true;
    kill_at_ = Clock::now() + spec_.stop_grace;
  }

  // Sends SIGTERM to the running ranks. Said now, not after the grace: a survivor frozen in a
  // collective would otherwise leave the log silent for 30 s.
  void stop_others(const std::string& why) {
    write_fully(STDERR_FILENO, "trainer launch: " + why + ", waiting up to " +
                                   seconds_text(spec_.stop_grace) + " for them to exit before SIGKILL\n");
    signal_running(children_, SIGTERM);
  }

  const AttemptSpec& spec_;
  std::vector<Child> children_;
  AttemptOutcome outcome_;
  int first_failed_ = -1;  // index into children_
  bool stopping_after_failure_ = false, killed_ = false;
  bool any_running_ = false;  // as over() last saw it
  Clock::time_point kill_at_{}, drain_until_{}, next_remote_check_{};
};

}  // namespace

AttemptOutcome run_attempt(const AttemptSpec& spec) {
  Attempt attempt(spec);
  attempt.start_ranks();
  attempt.announce_pids();
  while (!attempt.over()) {
    attempt.wait_for_events();
    attempt.handle_signals();
    attempt.relay_output();
    attempt.reap_exited();
    attempt.check_other_nodes();
    attempt.kill_after_grace();
  }
  return attempt.finish();
}

int launcher_stop_signal() { return g_first_stop; }

}  // namespace trainer
