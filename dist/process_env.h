#pragma once
// Who this process is in a distributed run, read from the launcher's environment variables. The launch
// contract is torchrun's (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT);
// SLURM's srun and OpenMPI's mpirun variables map onto it; without any of them the process runs alone
// (world size 1). Parsing is a pure function of an environment map so every launcher is testable.
//
// Precedence: torchrun variables (any of RANK / WORLD_SIZE set), then SLURM (SLURM_PROCID set), then
// OpenMPI (OMPI_COMM_WORLD_RANK set), else single process. MASTER_ADDR / MASTER_PORT in the
// environment always win over what a launcher implies, so a user can override them.
//
// Where our rendezvous store listens (store_port):
//   - TRAINER_STORE_PORT when set;
//   - MASTER_PORT + 1 under torchrun (TORCHELASTIC_RUN_ID set): torchrun's agent already serves its own
//     c10d TCPStore on MASTER_PORT, and its wire protocol is a private, versioned detail of PyTorch,
//     so we serve ours next to it rather than speak theirs;
//   - MASTER_PORT otherwise.
#include <map>
#include <string>
#include <vector>

namespace trainer {

using EnvMap = std::map<std::string, std::string>;

struct ProcessEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int store_port = 29500;
  // Says where store_port came from, for messages: "MASTER_PORT", "MASTER_PORT+1 (...)", ...
  std::string store_port_source = "MASTER_PORT";
  std::string launcher = "single";  // "torchrun", "env" (set by hand), "slurm", "openmpi" or "single"
  // Identifies this launch where the launcher says (TORCHELASTIC_RUN_ID, SLURM_JOB_ID.SLURM_STEP_ID,
  // OpenMPI's job id, or TRAINER_RUN_ID); "" when unknown. The store refuses clients of another job.
  std::string job_id;
  // Assumptions made while reading the environment (e.g. LOCAL_RANK missing); worth a log line.
  std::vector<std::string> notes;

  bool distributed() const { return world_size > 1; }
  bool is_rank0() const { return rank == 0; }
  // "rank 1/4 (local 1/2) via torchrun, master node01:29500"
  std::string describe() const;
};

// Reads the environment; throws DistError naming the variable and a HINT when a variable is missing,
// not a number, or inconsistent (RANK >= WORLD_SIZE, LOCAL_RANK >= LOCAL_WORLD_SIZE, ...).
ProcessEnv process_env_from(const EnvMap& env);
// The current process's environment (environ) as a map.
EnvMap current_environment();
inline ProcessEnv process_env() { return process_env_from(current_environment()); }

// Expands a SLURM host list: "node[01-03,07],gpu-a1" -> node01 node02 node03 node07 gpu-a1. Ranges keep
// their zero padding; several bracket groups in one name multiply out ("r[1-2]n[1-2]"). Throws
// DistError on malformed input.
std::vector<std::string> expand_slurm_nodelist(const std::string& list);

}  // namespace trainer
