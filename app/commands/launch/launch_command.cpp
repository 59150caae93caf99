#include "app/commands/launch/launch_command.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <set>

#include "app/commands/launch/launch_rendezvous.h"
#include "app/common/cli.h"
#include "dist/error.h"
#include "dist/process_env.h"
#include "dist/store.h"

namespace trainer {
namespace {

const char* kLaunchUsage =
    "usage: trainer launch --nproc-per-node N [--max-restarts K]\n"
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
    "  --max-restarts K      after a failure, start all local ranks again, up to K times (default 0),\n"
    "                        adding `--resume auto` to a train command: it continues from the last\n"
    "                        checkpoint of its run directory. The ranks read the attempt in\n"
    "                        TORCHELASTIC_RESTART_COUNT and TRAINER_RESTART_COUNT. With several\n"
    "                        nodes, every node's launcher needs the same K: they agree on each\n"
    "                        restart through node 0's launcher on MASTER_PORT + 1, so a failure on\n"
    "                        one node restarts all of them together\n"
    "  --nnodes M            nodes in the job (default 1); run one launcher per node\n"
    "  --node-rank R         this node's index, 0 .. M-1 (default 0); RANK = R * N + local rank\n"
    "  --master-addr HOST    host of rank 0 (default 127.0.0.1; required when M > 1)\n"
    "  --master-port PORT    rendezvous port on HOST (default 29500)\n"
    "Each flag also takes torchrun's spelling (--nproc_per_node) and the form --flag=value.\n\n"
    "example: trainer launch --nproc-per-node 2 --max-restarts 3 -- train configs/fashion_mnist_cnn.toml\n";

// Long enough for a survivor blocked in a collective with the dead rank to notice (a few seconds of
// silent heartbeat, dist/peer_liveness.h), print its error naming that rank and exit by itself;
// torchrun's agent waits as long.
constexpr std::chrono::milliseconds kStopGrace = std::chrono::seconds(30);

int parse_int(const std::string& flag, const std::string& value) {
  int v = 0;
  const char* end = value.data() + value.size();
  auto [p, ec] = std::from_chars(value.data(), end, v);
  if (value.empty() || ec != std::errc() || p != end)
    throw UsageError(flag + " expects a whole number, got '" + value + "'");
  return v;
}

// torchrun spells its flags with underscores (--nproc_per_node), ours with hyphens: both are taken,
// so a torchrun command line works after swapping the program name.
std::string hyphenated(std::string flag) {
  std::replace(flag.begin() + 2, flag.end(), '_', '-');
  return flag;
}

const std::set<std::string> kValueFlags = {"--nproc-per-node", "--nnodes",      "--node-rank",
                                           "--master-addr",    "--master-port", "--max-restarts"};

// What LaunchArgs cannot tell validation: whether a flag was given at all (a default can equal a
// given value) and whether `--` came.
struct SeenFlags {
  bool separator = false, master_addr = false, nproc = false;
};

void apply_launch_option(LaunchArgs& a, SeenFlags& seen, const std::string& name, const std::string& value) {
  if (name == "--nproc-per-node") {
    a.nproc_per_node = parse_int(name, value);
    seen.nproc = true;
  } else if (name == "--nnodes") {
    a.nnodes = parse_int(name, value);
  } else if (name == "--node-rank") {
    a.node_rank = parse_int(name, value);
  } else if (name == "--master-addr") {
    if (value.empty()) throw UsageError("--master-addr needs a host name or address");
    a.master_addr = value;
    seen.master_addr = true;
  } else if (name == "--master-port") {
    a.master_port = parse_int(name, value);
  } else if (name == "--max-restarts") {
    a.max_restarts = parse_int(name, value);
  }
}

// Reads the options before `--` into a; returns the index of the command's first argument.
size_t read_launch_options(const std::vector<std::string>& args, LaunchArgs& a, SeenFlags& seen) {
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      seen.separator = true;
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
    const size_t eq = arg.find('=');
    const std::string given = arg.substr(0, eq);  // as the user spelled it, for the messages
    const std::string name = hyphenated(given);
    if (!kValueFlags.count(name)) throw UsageError("unknown option " + given);
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else {
      if (i + 1 >= args.size() || args[i + 1] == "--") throw UsageError(given + " needs a value");
      value = args[++i];
    }
    apply_launch_option(a, seen, name, value);
  }
  return i;
}

void check_launch_args(const LaunchArgs& a, const SeenFlags& seen) {
  if (!seen.nproc) throw UsageError("--nproc-per-node N is required (the number of ranks on this node)");
  if (a.nproc_per_node < 1 || a.nproc_per_node > 4096)
    throw UsageError("--nproc-per-node must be between 1 and 4096, got " + std::to_string(a.nproc_per_node));
  if (a.nnodes < 1) throw UsageError("--nnodes must be at least 1, got " + std::to_string(a.nnodes));
  if (a.node_rank < 0 || a.node_rank >= a.nnodes)
    throw UsageError("--node-rank must be between 0 and " + std::to_string(a.nnodes - 1) + " (--nnodes " +
                     std::to_string(a.nnodes) + "), got " + std::to_string(a.node_rank));
  if (a.master_port < 1 || a.master_port > 65535)
    throw UsageError("--master-port must be between 1 and 65535, got " + std::to_string(a.master_port));
  if (a.nnodes > 1 && !seen.master_addr)
    throw UsageError("--nnodes " + std::to_string(a.nnodes) +
                     " needs --master-addr HOST (the host of node rank 0); 127.0.0.1 reaches only this node");
  if (a.max_restarts < 0)
    throw UsageError("--max-restarts must be 0 or more, got " + std::to_string(a.max_restarts));
  if (static_cast<long long>(a.nnodes) * a.nproc_per_node > (1 << 20))
    throw UsageError("--nnodes x --nproc-per-node is too large");
  if (!seen.separator)
    throw UsageError(
        "missing `--` and the command to run: trainer launch --nproc-per-node N -- train CONFIG");
  if (a.command.empty()) throw UsageError("nothing to run after `--`: e.g. -- train CONFIG");
  if (a.command[0] == "launch") throw UsageError("the command after `--` cannot be launch itself");
}

std::string self_executable() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "/proc/self/exe";
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace

// ---- arguments and environment ----

LaunchArgs parse_launch_args(const std::vector<std::string>& args) {
  LaunchArgs a;
  SeenFlags seen;
  const size_t command_start = read_launch_options(args, a, seen);
  if (a.help) return a;
  a.command.assign(args.begin() + static_cast<std::ptrdiff_t>(command_start), args.end());
  check_launch_args(a, seen);
  return a;
}

EnvMap launch_child_environment(EnvMap env, const LaunchArgs& a, int local_rank, int restart_count) {
  env.erase("TORCHELASTIC_RUN_ID");
  env["RANK"] = std::to_string(a.node_rank * a.nproc_per_node + local_rank);
  env["WORLD_SIZE"] = std::to_string(a.nnodes * a.nproc_per_node);
  env["LOCAL_RANK"] = std::to_string(local_rank);
  env["LOCAL_WORLD_SIZE"] = std::to_string(a.nproc_per_node);
  env["MASTER_ADDR"] = a.master_addr;
  env["MASTER_PORT"] = std::to_string(a.master_port);
  // torchrun's name, which scripts written for torchrun read, and ours (metrics/exporter.h).
  env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(restart_count);
  env["TRAINER_RESTART_COUNT"] = std::to_string(restart_count);
  // A rank whose launcher died gets SIGTERM (launch_ranks.cpp); with this it can say so in its log.
  env["TRAINER_LAUNCHER_PID"] = std::to_string(::getpid());
  return env;
}

namespace {

bool has_resume(const std::vector<std::string>& command) {
  for (const std::string& arg : command)
    if (arg == "--resume" || arg.rfind("--resume=", 0) == 0) return true;
  return false;
}

}  // namespace

std::vector<std::string> restart_command(const std::vector<std::string>& command,
                                         const std::string& run_dir) {
  if (command.empty() || command[0] != "train" || run_dir.empty() || has_resume(command)) return command;
  std::vector<std::string> with_resume = command;
  with_resume.insert(with_resume.end(), {"--set", "train.run_dir=" + run_dir, "--resume", "auto"});
  return with_resume;
}

// ---- the command ----

namespace {

// The summary of a failed attempt: the first rank to fail, how it ended, and its last error line.
std::string failure_line(const AttemptOutcome& o) {
  return "trainer launch: rank " + std::to_string(o.failed_rank) + " failed (" +
         describe_exit(o.failed_status) + "); " +
         (o.failed_error.empty() ? std::string("it printed nothing on stderr")
                                 : "its last error line: " + o.failed_error) +
         "\n";
}

// How a restart continues, for its log line.
std::string restart_how(const std::vector<std::string>& command, const std::string& run_dir) {
  if (command[0] != "train") return "";
  if (has_resume(command)) return " with the command's own --resume";
  if (run_dir.empty())
    return " from scratch (no rank announced its run directory, so there is no checkpoint to resume)";
  return " with --resume auto in " + run_dir;
}

// Test hooks (app/commands/launch/launch_command.h), read once.
std::string program_to_run() {
  const char* program = std::getenv("TRAINER_TEST_LAUNCH_PROGRAM");
  return program && *program ? program : self_executable();
}

std::chrono::milliseconds stop_grace() {
  const char* ms = std::getenv("TRAINER_TEST_LAUNCH_STOP_GRACE_MS");
  return ms && std::atoll(ms) > 0 ? std::chrono::milliseconds(std::atoll(ms)) : kStopGrace;
}

// One launcher starts the whole job on one node, so it can name the job: the rendezvous store then
// refuses ranks of another launch that happens to use the same port. Launchers of several nodes
// cannot agree on a name without talking, so there the user may set TRAINER_RUN_ID. A restart keeps
// the name: the ranks of the failed attempt are all gone when it starts.
std::string own_run_id() {
  return "launch-" + std::to_string(::getpid()) + "-" +
         std::to_string(std::chrono::system_clock::now().time_since_epoch().count());
}

// Agrees on attempt `restart` with the other nodes' launchers: the job's name and node 0's run
// directory; this node's first failure is reported to them and theirs stop this node's ranks.
void agree_with_other_nodes(LauncherRendezvous& rendezvous, const LaunchArgs& a, int restart,
                            const std::string& own_run_id, EnvMap& base, std::string& run_dir,
                            AttemptSpec& spec) {
  const auto agreed =
      rendezvous.begin(restart, base.count("TRAINER_RUN_ID") ? base["TRAINER_RUN_ID"] : own_run_id, run_dir);
  base["TRAINER_RUN_ID"] = agreed.run_id;
  if (restart > 0 && a.node_rank != 0)
    write_fully(STDERR_FILENO, "trainer launch: attempt " + std::to_string(restart) +
                                   " agreed with node 0:" + restart_how(a.command, agreed.run_dir) + "\n");
  run_dir = agreed.run_dir;  // only node 0's rank 0 announces it
  spec.report_failure = [&rendezvous, node_rank = a.node_rank, restart](const std::string& why) {
    rendezvous.report_failure(restart, "node " + std::to_string(node_rank) + ": " + why);
  };
  spec.remote_failure = [&rendezvous, restart] { return rendezvous.failure(restart); };
}

std::vector<RankSpec> local_ranks(const EnvMap& base, const LaunchArgs& a, int restart) {
  std::vector<RankSpec> ranks;
  for (int i = 0; i < a.nproc_per_node; ++i)
    ranks.push_back({a.node_rank * a.nproc_per_node + i, launch_child_environment(base, a, i, restart)});
  return ranks;
}

std::string attempt_start_line(const LaunchArgs& a, int restart) {
  return (restart == 0
              ? std::string()
              : "restart " + std::to_string(restart) + " of " + std::to_string(a.max_restarts) + ": ") +
         "node " + std::to_string(a.node_rank) + "/" + std::to_string(a.nnodes) + ", world size " +
         std::to_string(a.nnodes * a.nproc_per_node) + ", master " + a.master_addr + ":" +
         std::to_string(a.master_port) + ";";
}

// What failed, and whether (and how) the launcher starts the ranks again.
std::string failure_summary(const AttemptOutcome& o, const LaunchArgs& a, int restart, bool restart_now,
                            bool follows_node0, const std::string& run_dir) {
  std::string summary =
      o.failed_rank >= 0 ? failure_line(o)
                         : "trainer launch: the attempt failed on another node: " + o.remote_failure + "\n";
  if (restart_now) {
    summary += "trainer launch: restart " + std::to_string(restart + 1) + " of " +
               std::to_string(a.max_restarts) + ": starting all " + std::to_string(a.nproc_per_node) +
               " local ranks again" +
               (follows_node0 ? std::string(" in the run directory node 0 announces")
                              : restart_how(a.command, run_dir)) +
               "\n";
  } else if (o.stop_signal != 0 && restart < a.max_restarts) {
    summary += "trainer launch: not restarting: the launcher was stopped by signal " +
               std::to_string(o.stop_signal) + "\n";
  } else if (a.max_restarts > 0) {
    summary += "trainer launch: no restarts left (--max-restarts " + std::to_string(a.max_restarts) +
               "); fix the cause above, then run again: --resume auto continues from the last "
               "checkpoint\n";
  }
  return summary;
}

// The launcher was stopped: says how each rank ended and exits as the signal would have.
int report_stopped(const AttemptOutcome& o) {
  std::string line = "trainer launch: stopped by signal " + std::to_string(o.stop_signal) + " (" +
                     strsignal(o.stop_signal) + ");";
  for (size_t k = 0; k < o.statuses.size(); ++k)
    line += " rank " + std::to_string(o.statuses[k].first) + " " + describe_exit(o.statuses[k].second) +
            (k + 1 == o.statuses.size() ? "" : ",");
  write_fully(STDERR_FILENO, line + "\n");
  return 128 + o.stop_signal;
}

// This node's ranks all succeeded; with several nodes, the job succeeded only if theirs did too.
int report_success(LauncherRendezvous* rendezvous, int restart) {
  if (!rendezvous) return 0;
  if (const std::string why = rendezvous->finish(restart); !why.empty()) {
    write_fully(STDERR_FILENO,
                "trainer launch: this node's ranks succeeded, but the job did not: " + why + "\n");
    return 1;
  }
  return 0;
}

int run_launch(const std::vector<std::string>& args) {
  const LaunchArgs a = parse_launch_args(args);
  if (a.help) {
    std::cout << kLaunchUsage;
    return 0;
  }
  EnvMap base = current_environment();
  const std::string run_id = own_run_id();
  if (a.nnodes == 1 && !base.count("TRAINER_RUN_ID")) base["TRAINER_RUN_ID"] = run_id;
  // Several nodes that may restart agree on each attempt through node 0's launcher
  // (app/commands/launch/launch_rendezvous.h), which also names the job for all of them.
  std::unique_ptr<LauncherRendezvous> rendezvous;

  LauncherSignals signals;
  if (a.nnodes > 1 && a.max_restarts > 0) {
    // Its waits for the other nodes (up to 5 minutes) end at once on Ctrl-C or SIGTERM.
    set_store_wait_interrupt([] { return launcher_stop_signal(); });
    if (a.node_rank != 0)
      write_fully(STDERR_FILENO, "trainer launch: node " + std::to_string(a.node_rank) + "/" +
                                     std::to_string(a.nnodes) +
                                     ": waiting up to 5 min for node 0's launcher on " + a.master_addr + ":" +
                                     std::to_string(a.master_port + 1) + "\n");
    rendezvous = std::make_unique<LauncherRendezvous>(a, std::chrono::minutes(5));
  }
  std::fflush(stdout);
  std::fflush(stderr);
  AttemptSpec spec;
  spec.program = program_to_run();
  spec.stop_grace = stop_grace();
  std::string run_dir;  // announced by a rank of an earlier attempt; kept until a later one announces
  for (int restart = 0;; ++restart) {
    if (rendezvous) agree_with_other_nodes(*rendezvous, a, restart, run_id, base, run_dir, spec);
    spec.command = restart == 0 ? a.command : restart_command(a.command, run_dir);
    spec.ranks = local_ranks(base, a, restart);
    spec.start_line = attempt_start_line(a, restart);
    const AttemptOutcome o = run_attempt(spec);
    if (!o.run_dir.empty()) run_dir = o.run_dir;

    if (o.failed_rank >= 0 || !o.remote_failure.empty()) {
      // A failure while the launcher was being stopped is not restarted: the user asked for the end.
      const bool restart_now = o.stop_signal == 0 && restart < a.max_restarts;
      const bool follows_node0 = rendezvous && a.node_rank != 0;
      write_fully(STDERR_FILENO, failure_summary(o, a, restart, restart_now, follows_node0, run_dir));
      if (restart_now) continue;
      return 1;
    }
    if (o.stop_signal != 0) return report_stopped(o);
    return report_success(rendezvous.get(), restart);
  }
}

}  // namespace

int launch_command(const std::vector<std::string>& args) {
  try {
    return run_launch(args);
  } catch (const WaitInterrupted& e) {
    // Between attempts, waiting for the other nodes' launchers: no rank of this node runs.
    write_fully(STDERR_FILENO, std::string("trainer launch: ") + e.what() + "\n");
    return 128 + e.signal();
  }
}

}  // namespace trainer
