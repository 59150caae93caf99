#include "app/launch_command.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <stdexcept>

#include "app/cli.h"
#include "dist/process_env.h"

namespace trainer {
namespace {

const char* kLaunchUsage =
    "usage: trainer launch --nproc-per-node N\n"
    "                      [--nnodes M --node-rank R --master-addr HOST --master-port PORT]\n"
    "                      -- COMMAND [ARGS ...]\n\n"
    "Runs `trainer COMMAND ARGS ...` as N ranks on this node, like torchrun: each process gets RANK,\n"
    "WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT. Every line the ranks print\n"
    "is prefixed with \"[rank R] \". SIGINT/SIGTERM/SIGHUP sent to the launcher are forwarded to the ranks "
    "(a\n"
    "training rank then checkpoints and exits). When a rank fails, the others get SIGTERM, then SIGKILL\n"
    "after 30 s (as torchrun), and the launcher names the first failing rank and its last error line (exit "
    "status 1).\n\n"
    "  --nproc-per-node N    processes on this node (required)\n"
    "  --nnodes M            nodes in the job (default 1); run one launcher per node\n"
    "  --node-rank R         this node's index, 0 .. M-1 (default 0); RANK = R * N + local rank\n"
    "  --master-addr HOST    host of rank 0 (default 127.0.0.1; required when M > 1)\n"
    "  --master-port PORT    rendezvous port on HOST (default 29500)\n\n"
    "example: trainer launch --nproc-per-node 2 -- train configs/fashion_mnist_cnn.toml\n";

// Long enough for a survivor blocked in a collective with the dead rank to notice (a few seconds of
// silent heartbeat, dist/peer_liveness.h), print its error naming that rank and exit by itself;
// torchrun's agent waits as long.
constexpr auto kStopGrace = std::chrono::seconds(30);

int parse_int(const std::string& flag, const std::string& value) {
  int v = 0;
  const char* end = value.data() + value.size();
  auto [p, ec] = std::from_chars(value.data(), end, v);
  if (value.empty() || ec != std::errc() || p != end)
    throw UsageError(flag + " expects a whole number, got '" + value + "'");
  return v;
}

// ---- signals: the handler only writes (signal, si_code, si_pid) into a pipe that the poll loop reads.
// SIGCHLD goes through it too, so ranks that fail milliseconds apart are seen in the order they died.

int g_signal_pipe[2] = {-1, -1};
// SIGHUP was ignored when the launcher started (nohup): it stays ignored here and in the ranks.
bool g_hup_ignored = false;

extern "C" void on_launcher_signal(int sig, siginfo_t* info, void*) {
  const int saved = errno;
  const int msg[3] = {sig, info ? info->si_code : SI_USER, info ? static_cast<int>(info->si_pid) : 0};
  [[maybe_unused]] ssize_t n = ::write(g_signal_pipe[1], msg, sizeof msg);
  errno = saved;
}

class SignalForwarding {
 public:
  SignalForwarding() {
    if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
      throw std::runtime_error(std::string("launch: pipe: ") + std::strerror(errno));
    struct sigaction sa {};
    sa.sa_sigaction = on_launcher_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
    // A closed terminal's SIGHUP is forwarded like SIGTERM, so the ranks checkpoint and stop (instead
    // of the launcher dying and the ranks losing the pipes they log to).
    ::sigaction(SIGHUP, nullptr, &old_hup_);
    g_hup_ignored = old_hup_.sa_handler == SIG_IGN;
    if (!g_hup_ignored) ::sigaction(SIGHUP, &sa, nullptr);
    sa.sa_flags |= SA_NOCLDSTOP;
    ::sigaction(SIGCHLD, &sa, &old_chld_);
    // A closed stdout (`| head`) must not kill the launcher while its ranks run.
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    ::sigaction(SIGPIPE, &ign, &old_pipe_);
  }
  ~SignalForwarding() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
    ::sigaction(SIGHUP, &old_hup_, nullptr);
    ::sigaction(SIGCHLD, &old_chld_, nullptr);
    ::sigaction(SIGPIPE, &old_pipe_, nullptr);
    ::close(g_signal_pipe[0]);
    ::close(g_signal_pipe[1]);
    g_signal_pipe[0] = g_signal_pipe[1] = -1;
  }
  SignalForwarding(const SignalForwarding&) = delete;
  SignalForwarding& operator=(const SignalForwarding&) = delete;

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
  struct sigaction old_hup_ {};
  struct sigaction old_chld_ {};
  struct sigaction old_pipe_ {};
};

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

void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // our own output is gone (EPIPE, ...): keep supervising the ranks anyway
    done += static_cast<size_t>(n);
  }
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

bool failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

std::string self_executable() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "/proc/self/exe";
  return std::string(buf, static_cast<size_t>(n));
}

// Starts one rank with its stdout/stderr on fresh pipes; stdin is /dev/null (N ranks cannot share it).
void spawn(Child& c, const std::string& exe, const std::vector<std::string>& command, const EnvMap& env) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0)
    throw std::runtime_error(std::string("launch: pipe: ") + std::strerror(errno));
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    throw std::runtime_error(std::string("launch: pipe: ") + std::strerror(errno));
  }
  std::vector<std::string> argv_s{exe};
  argv_s.insert(argv_s.end(), command.begin(), command.end());
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s;
  for (const auto& [k, v] : env) env_s.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_s) envp.push_back(s.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&fa, err[1], STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  // SIGPIPE is ignored here, not in the ranks; SIGHUP stays ignored in them under nohup.
  if (g_hup_ignored) sigdelset(&all, SIGHUP);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  const int rc = ::posix_spawn(&c.pid, exe.c_str(), &fa, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  ::close(out[1]);
  ::close(err[1]);
  if (rc != 0) {
    ::close(out[0]);
    ::close(err[0]);
    throw std::runtime_error("launch: cannot start rank " + std::to_string(c.rank) + " (" + exe +
                             "): " + std::strerror(rc));
  }
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
      write_all(out_fd, lines.feed(buf, static_cast<size_t>(n)));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    write_all(out_fd, lines.flush());
    ::close(*fd);
    *fd = -1;
    return;
  }
}

}  // namespace

// ---- LinePrefixer ----

void LinePrefixer::take_line(const std::string& line, std::string* out) {
  out->append(prefix_).append(line).push_back('\n');
  if (line.find_first_not_of(" \t\r") != std::string::npos) {
    last_line_ = line;
    if (!last_line_.empty() && last_line_.back() == '\r') last_line_.pop_back();
    if (last_line_.find("error:") != std::string::npos) error_line_ = last_line_;
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

// ---- arguments and environment ----

LaunchArgs parse_launch_args(const std::vector<std::string>& args) {
  LaunchArgs a;
  bool saw_separator = false, saw_master_addr = false, saw_nproc = false;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      saw_separator = true;
      ++i;
      break;
    }
    if (arg == "--help" || arg == "-h") {
      a.help = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0)
      throw UsageError("missing `--` before the command '" + arg +
                       "': write trainer launch --nproc-per-node N -- " + arg + " ...");
    std::string name = arg, value;
    if (const size_t eq = arg.find('='); eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    } else {
      const bool known = name == "--nproc-per-node" || name == "--nnodes" || name == "--node-rank" ||
                         name == "--master-addr" || name == "--master-port";
      if (!known) throw UsageError("unknown option " + arg);
      if (i + 1 >= args.size() || args[i + 1] == "--") throw UsageError(name + " needs a value");
      value = args[++i];
    }
    if (name == "--nproc-per-node") {
      a.nproc_per_node = parse_int(name, value);
      saw_nproc = true;
    } else if (name == "--nnodes") {
      a.nnodes = parse_int(name, value);
    } else if (name == "--node-rank") {
      a.node_rank = parse_int(name, value);
    } else if (name == "--master-addr") {
      if (value.empty()) throw UsageError("--master-addr needs a host name or address");
      a.master_addr = value;
      saw_master_addr = true;
    } else if (name == "--master-port") {
      a.master_port = parse_int(name, value);
    } else {
      throw UsageError("unknown option " + name);
    }
  }
  if (a.help) return a;
  a.command.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  if (!saw_nproc) throw UsageError("--nproc-per-node N is required (the number of ranks on this node)");
  if (a.nproc_per_node < 1 || a.nproc_per_node > 4096)
    throw UsageError("--nproc-per-node must be between 1 and 4096, got " + std::to_string(a.nproc_per_node));
  if (a.nnodes < 1) throw UsageError("--nnodes must be at least 1, got " + std::to_string(a.nnodes));
  if (a.node_rank < 0 || a.node_rank >= a.nnodes)
    throw UsageError("--node-rank must be between 0 and " + std::to_string(a.nnodes - 1) + " (--nnodes " +
                     std::to_string(a.nnodes) + "), got " + std::to_string(a.node_rank));
  if (a.master_port < 1 || a.master_port > 65535)
    throw UsageError("--master-port must be between 1 and 65535, got " + std::to_string(a.master_port));
  if (a.nnodes > 1 && !saw_master_addr)
    throw UsageError("--nnodes " + std::to_string(a.nnodes) +
                     " needs --master-addr HOST (the host of node rank 0); 127.0.0.1 reaches only this node");
  if (static_cast<long long>(a.nnodes) * a.nproc_per_node > (1 << 20))
    throw UsageError("--nnodes x --nproc-per-node is too large");
  if (!saw_separator)
    throw UsageError(
        "missing `--` and the command to run: trainer launch --nproc-per-node N -- train CONFIG");
  if (a.command.empty()) throw UsageError("nothing to run after `--`: e.g. -- train CONFIG");
  if (a.command[0] == "launch") throw UsageError("the command after `--` cannot be launch itself");
  return a;
}

EnvMap launch_child_environment(EnvMap env, const LaunchArgs& a, int local_rank) {
  env.erase("TORCHELASTIC_RUN_ID");
  env["RANK"] = std::to_string(a.node_rank * a.nproc_per_node + local_rank);
  env["WORLD_SIZE"] = std::to_string(a.nnodes * a.nproc_per_node);
  env["LOCAL_RANK"] = std::to_string(local_rank);
  env["LOCAL_WORLD_SIZE"] = std::to_string(a.nproc_per_node);
  env["MASTER_ADDR"] = a.master_addr;
  env["MASTER_PORT"] = std::to_string(a.master_port);
  return env;
}

// ---- the command ----

int launch_command(const std::vector<std::string>& args) {
  const LaunchArgs a = parse_launch_args(args);
  if (a.help) {
    std::cout << kLaunchUsage;
    return 0;
  }
  EnvMap base = current_environment();
  // One launcher starts the whole job on one node, so it can name the job: the rendezvous store then
  // refuses ranks of another launch that happens to use the same port. Launchers of several nodes
  // cannot agree on a name without talking, so there the user may set TRAINER_RUN_ID.
  if (a.nnodes == 1 && !base.count("TRAINER_RUN_ID"))
    base["TRAINER_RUN_ID"] = "launch-" + std::to_string(::getpid()) + "-" +
                             std::to_string(std::chrono::system_clock::now().time_since_epoch().count());

  SignalForwarding signals;
  std::fflush(stdout);
  std::fflush(stderr);
  const std::string exe = self_executable();
  std::vector<Child> children;
  children.reserve(static_cast<size_t>(a.nproc_per_node));
  try {
    for (int i = 0; i < a.nproc_per_node; ++i) {
      children.emplace_back(a.node_rank * a.nproc_per_node + i);
      spawn(children.back(), exe, a.command, launch_child_environment(base, a, i));
    }
  } catch (...) {
    signal_running(children, SIGKILL);
    for (auto& c : children)
      if (c.running) ::waitpid(c.pid, nullptr, 0);
    throw;
  }
  {
    std::string line = "trainer launch: node " + std::to_string(a.node_rank) + "/" +
                       std::to_string(a.nnodes) + ", world size " +
                       std::to_string(a.nnodes * a.nproc_per_node) + ", master " + a.master_addr + ":" +
                       std::to_string(a.master_port) + ";";
    for (const auto& c : children)
      line += " rank " + std::to_string(c.rank) + " pid " + std::to_string(c.pid) +
              (&c == &children.back() ? "" : ",");
    write_all(STDERR_FILENO, line + "\n");
  }

  using Clock = std::chrono::steady_clock;
  int first_failed = -1;  // index into children
  int stop_signal = 0;    // the first SIGINT/SIGTERM/SIGHUP the launcher received
  bool stopping_after_failure = false, killed = false;
  Clock::time_point kill_at{}, drain_until{};
  for (;;) {
    bool any_running = false, any_open = false;
    for (const auto& c : children) {
      any_running |= c.running;
      any_open |= c.out_fd >= 0 || c.err_fd >= 0;
    }
    if (!any_running) {
      // All ranks are gone; what they wrote is still in the pipes. A grandchild holding a pipe open
      // must not keep the launcher alive, hence the bound.
      if (!any_open) break;
      if (drain_until == Clock::time_point{}) drain_until = Clock::now() + std::chrono::seconds(1);
      if (Clock::now() >= drain_until) break;
    }
    std::vector<pollfd> fds{{g_signal_pipe[0], POLLIN, 0}};
    for (const auto& c : children) {
      if (c.out_fd >= 0) fds.push_back({c.out_fd, POLLIN, 0});
      if (c.err_fd >= 0) fds.push_back({c.err_fd, POLLIN, 0});
    }
    // SIGCHLD wakes the poll; the timeout bounds how late a merged one, or the SIGKILL deadline, is seen.
    if (::poll(fds.data(), fds.size(), 50) < 0 && errno != EINTR)
      throw std::runtime_error(std::string("launch: poll: ") + std::strerror(errno));

    auto reap = [&](Child& c) {
      int status = 0;
      const pid_t r = ::waitpid(c.pid, &status, WNOHANG);
      if (r == 0 || (r < 0 && errno == EINTR)) return;
      c.running = false;
      c.status = r == c.pid ? status : 0;
      if (failed(c.status) && first_failed < 0 && stop_signal == 0 && !stopping_after_failure) {
        first_failed = static_cast<int>(&c - children.data());
        stopping_after_failure = true;
        kill_at = Clock::now() + kStopGrace;
        signal_running(children, SIGTERM);
      }
    };
    for (int msg[3]; ::read(g_signal_pipe[0], msg, sizeof msg) == static_cast<ssize_t>(sizeof msg);) {
      if (msg[0] == SIGCHLD) {
        for (auto& c : children)
          if (c.running && c.pid == msg[2]) reap(c);
        continue;
      }
      if (stop_signal == 0) stop_signal = msg[0];
      // A terminal's Ctrl-C (si_code SI_KERNEL) already reached the ranks, which share our process
      // group. A hang-up the kernel sends to us as the session's leader (`ssh -t host trainer launch`)
      // may not have: it is forwarded whatever its origin (a rank takes a repeat within a second as
      // the same request, app/train_signals.h).
      if (msg[1] != SI_KERNEL || msg[0] == SIGHUP) signal_running(children, msg[0]);
    }
    for (auto& c : children) {
      if (c.out_fd >= 0) pump(&c.out_fd, c.out, STDOUT_FILENO);
      if (c.err_fd >= 0) pump(&c.err_fd, c.err, STDERR_FILENO);
    }
    // SIGCHLDs that arrive together merge into one: the sweep catches those.
    for (auto& c : children)
      if (c.running) reap(c);
    if (stopping_after_failure && !killed && Clock::now() >= kill_at) {
      signal_running(children, SIGKILL);
      killed = true;
    }
  }
  // Close what a grandchild kept open.
  for (auto& c : children) {
    write_all(STDOUT_FILENO, c.out.flush());
    write_all(STDERR_FILENO, c.err.flush());
    if (c.out_fd >= 0) ::close(c.out_fd);
    if (c.err_fd >= 0) ::close(c.err_fd);
  }

  if (first_failed >= 0) {
    const Child& c = children[static_cast<size_t>(first_failed)];
    const std::string last = c.err.error_line();
    write_all(
        STDERR_FILENO,
        "trainer launch: rank " + std::to_string(c.rank) + " failed (" + describe_status(c.status) + "); " +
            (last.empty() ? std::string("it printed nothing on stderr") : "its last error line: " + last) +
            "\n");
    return 1;
  }
  if (stop_signal != 0) {
    std::string line = "trainer launch: stopped by signal " + std::to_string(stop_signal) + " (" +
                       strsignal(stop_signal) + ");";
    for (const auto& c : children)
      line += " rank " + std::to_string(c.rank) + " " + describe_status(c.status) +
              (&c == &children.back() ? "" : ",");
    write_all(STDERR_FILENO, line + "\n");
    return 128 + stop_signal;
  }
  return 0;
}

}  // namespace trainer
