#pragma once
// How `trainer train` starts, before its first step (app/train/train_loop.cpp runs these in order): NCCL's
// settings from the config, the communicator options, rank 0's choice of run directory, the run log,
// the ranks' agreement on build, config, data and steps, ZeRO's wrapper, the exporter's options, and
// where the run starts (a fresh start or a checkpoint) as every rank agrees on it before anything is
// written. Also the start-up warnings and notes a user moving from one GPU to many should see.
#include <chrono>
#include <cstdint>
#include <string>

#include "app/common/build_info.h"
#include "app/config/config.h"
#include "app/run/checkpoint.h"
#include "app/run/experiment.h"
#include "app/train/train_loop.h"
#include "dist/process_env.h"
#include "dist/process_group.h"
#include "metrics/exporter.h"
#include "metrics/log.h"
#include "metrics/output_file.h"
#include "nn/device.h"

namespace trainer {

class ZeroOptimizer;

// A warning when `workers` loader threads (data.workers) on each of a node's `local_world_size` ranks
// start more threads than the node has `cores` (the seed guides' pitfall: "the total worker count
// balloons and exhausts the CPU's memory"); "" when they fit, and for workers < 0 (the default shares
// the cores between the node's ranks).
std::string loader_workers_warning(int workers, int local_world_size, unsigned cores);

// NCCL reads its settings from the environment when the communicator is created: dist.nccl_debug and
// dist.socket_ifname become NCCL_DEBUG and NCCL_SOCKET_IFNAME for this process (the seed guides'
// "NCCL picks the wrong interface" and "turn on NCCL's logs"), so users need not export them on every
// node by hand. Empty keys leave the environment as it is.
void export_nccl_settings(const Config& config);

// A note when several ranks (or accumulated micro-batches) train with optim.lr as given
// (optim.lr_scaling = "none") on a global batch larger than data.batch_size: the seed guides' rule
// scales the learning rate with the global batch, and a user moving from one GPU may have forgotten.
// "" with one rank and no accumulation, or with optim.lr_scaling = "linear".
std::string lr_scaling_note(const Config& config, int world_size);

// The communicator's options: backend, timeouts, the build line and (under NCCL) the GPU's UUID that
// ranks compare before connecting.
DistOptions dist_options(const Config& config, const Device& device, const TrainerBuild& build);

// train.run_dir; with --resume auto and no explicit run_dir, the newest run directory of this config;
// otherwise a new timestamped one (`fresh`: the trainer named it, so another name is as good). Rank 0
// proposes it (ranks start at different seconds) and the others take its final choice.
struct ProposedRunDir {
  std::string path;
  bool fresh = false;
};
ProposedRunDir propose_run_dir(const Config& config, const TrainOptions& options);

// Rank 0 logs to train.log (and the terminal), the others to train.rank<N>.log; the run starts with the
// resolved configuration, which rank 0 also writes to config.toml.
// Writes go where `full_disk` says (a test hook, metrics/output_file.h).
void open_run_log(Log& log, const Config& config, const ProcessEnv& env, const std::string& run_dir,
                  const std::string& config_toml, int rank, const FullDiskHook& full_disk = {});

// Stops the run, naming what differs, unless every rank has the same build, config, data, steps per
// epoch, kind of device and processes per node (world size > 1 only).
void check_ranks_agree(ProcessGroup& pg, const TrainerBuild& build, const std::string& config_toml,
                       const Experiment& e, const Device& device, const ProcessEnv& env,
                       const DistOptions& dopt);

// dist.zero_stage 1|2: wraps e.optimizer in a ZeroOptimizer and returns it; null with stage 0.
ZeroOptimizer* wrap_in_zero_optimizer(const Config& config, Experiment& e, ProcessGroup& pg, Log& log);

// The run's data, model, device, directory and build, for the log.
void log_run_description(Log& log, const Config& config, const Experiment& e, const Device& device,
                         const std::string& run_dir, const TrainerBuild& build);

// The exporter's options (metrics.bind, metrics.port + LOCAL_RANK, the labels, the build). The run label
// is metrics.run, else the run directory's name, so that two runs on one host stay apart.
ExporterOptions exporter_options(const Config& config, const ProcessEnv& env, int rank,
                                 const TrainerBuild& build, const std::string& run_dir);

// What --resume means for this rank: "" (a fresh start) or a checkpoint directory. "auto" is resolved
// by rank 0 alone (the newest complete checkpoint in ckpt_dir), and with a store the others take its
// choice: rank 0 writes the checkpoints, and another node's view of a shared directory can be stale
// (NFS caches directory listings), which would otherwise stop the run at the agreement below for
// nothing. A node that cannot see rank 0's checkpoint at all still stops there, naming it. `store` may
// be null (one rank); `timeout` bounds the others' wait for rank 0. Checkpoints that do not fit `limits`
// (when given) are skipped as broken; when every checkpoint is broken it throws CheckpointError
// instead of starting from scratch. With "auto", a newer checkpoint in `rescue_dir` (where a final
// checkpoint goes when checkpoint.dir cannot take it) wins.
std::string agreed_resume(const std::string& resume, const std::string& ckpt_dir, int rank, Store* store,
                          std::chrono::milliseconds timeout, Log& log, const ResumeLimits* limits = nullptr,
                          const std::string& rescue_dir = "");

// Where this run starts, loaded on every rank (--resume), then agreed by all ranks (world size > 1):
// a rank given another checkpoint, started without --resume, or unable to load its checkpoint stops
// every rank at once, naming each rank's start. `start` is set to this rank's.
TrainingState agreed_start(const Config& config, const TrainOptions& options, Experiment& e,
                           const std::string& run_dir, const std::string& ckpt_dir, Log& log,
                           ProcessGroup& pg, const DistOptions& dopt, std::string& start);

// Keeps the lines of a step CSV (train_steps.csv, step_times.csv) up to `last_step` under `header`: the
// steps a crashed run logged after its last checkpoint are run again, and must appear once. A file
// that lost its header (empty after a kill before its first write reached the disk) gets it back.
void truncate_step_csv(const std::string& path, int64_t last_step, const std::string& header,
                       const FullDiskHook& full_disk = {});

// Rank 0's train_steps.csv from where the run starts (`start` as agreed_start set it): cut back to the
// checkpoint's step on a resume, a header alone on a fresh start.
void begin_step_csv(const std::string& csv_path, const std::string& start, const TrainingState& st,
                    const FullDiskHook& full_disk = {});

}  // namespace trainer
