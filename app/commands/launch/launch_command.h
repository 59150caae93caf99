#pragma once
// `trainer launch`: torchrun for this node. Starts N copies of this binary running a subcommand, each
// with the torchrun variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT), prefixes every line they print with "[rank R] ", forwards SIGINT/SIGTERM to them, and
// when one fails stops the others (SIGTERM, SIGKILL after 30 s) and names the first failing rank with
// its last stderr line. With --max-restarts N it then starts all of them again, up to N times, with
// `--resume auto` (torchrun's --max-restarts), and TORCHELASTIC_RESTART_COUNT / TRAINER_RESTART_COUNT
// tell the ranks which attempt they are. Flags take torchrun's spelling too (--nproc_per_node).
//
// Test hooks, read once at start: TRAINER_TEST_LAUNCH_PROGRAM=PATH runs PATH instead of this binary
// (a shell script as a rank); TRAINER_TEST_LAUNCH_STOP_GRACE_MS=MS replaces the 30 s grace.
//
// The children stay in the launcher's process group, so a Ctrl-C at a terminal reaches them directly;
// the launcher forwards only signals that were sent to it alone (kill, a scheduler), never a
// terminal's, because a second SIGINT makes a training child stop at once instead of checkpointing.
#include <map>
#include <string>
#include <vector>

#include "app/commands/launch/launch_ranks.h"

namespace trainer {

struct LaunchArgs {
  int nproc_per_node = 0;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int max_restarts = 0;  // restarts of all local ranks after a failure (torchrun's --max-restarts)
  std::vector<std::string> command;  // what follows `--`: the subcommand and its arguments
  bool help = false;
};

// Parses the arguments after `launch`; throws UsageError on anything invalid.
LaunchArgs parse_launch_args(const std::vector<std::string>& args);

// The environment of local rank `local_rank` in attempt `restart_count` (0 = the first start): `base`
// with the torchrun variables and TORCHELASTIC_RESTART_COUNT / TRAINER_RESTART_COUNT set, and
// TORCHELASTIC_RUN_ID removed (the children must not believe torchrun started them).
std::map<std::string, std::string> launch_child_environment(std::map<std::string, std::string> base,
                                                            const LaunchArgs& a, int local_rank,
                                                            int restart_count = 0);

// The command of a restart: a `train` command without a --resume of its own continues in `run_dir`,
// the run directory an earlier attempt announced ("--set train.run_dir=RUN_DIR --resume auto"
// appended). Any other command is unchanged, and so is a train command when no attempt got as far as
// choosing its run directory (`run_dir` empty: there is no checkpoint of this job to resume, and
// `--resume auto` alone would pick the newest run of the config, maybe an older job's).
std::vector<std::string> restart_command(const std::vector<std::string>& command, const std::string& run_dir);

int launch_command(const std::vector<std::string>& args);

}  // namespace trainer
