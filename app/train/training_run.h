#pragma once
// TrainingRun: the one owner of everything a `trainer train` run is made of -- its settings (read once),
// process group, device, model and optimizer, gradient reducer, loss scaler, data sampler, step timer,
// exporter, checkpoints and logs -- and of the loop's state. start_run() builds it in named phases;
// run_training (app/train/train_loop.cpp) then reads as a straight line over it. Members are declared in the
// order they are built and so destroyed in reverse: the CUDA graph before the process group, the
// reducer before the communicator.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "app/common/build_info.h"
#include "app/config/config.h"
#include "app/run/checkpoint.h"
#include "app/run/experiment.h"
#include "app/run/run_directory.h"
#include "app/train/fault_injection.h"
#include "app/train/host_readback.h"
#include "app/train/step_function.h"
#include "app/train/step_graph.h"
#include "app/train/summary.h"
#include "app/train/train_loop.h"
#include "data/distributed_sampler.h"
#include "dist/gradient_reducer.h"
#include "dist/heartbeat.h"
#include "dist/process_env.h"
#include "dist/process_group.h"
#include "dist/zero_optimizer.h"
#include "metrics/exporter.h"
#include "metrics/gpu_utilization.h"
#include "metrics/log.h"
#include "metrics/output_file.h"
#include "metrics/run_csv.h"
#include "metrics/step_timer.h"
#include "nn/amp/loss_scaler.h"
#include "nn/amp/precision_policy.h"

namespace trainer {

// Where the run writes, decided once all ranks agree on it.
struct RunPaths {
  std::string run_dir;
  std::string ckpt_dir;
  std::string config_toml;  // the resolved config, as every checkpoint stores it
};

// Train-step bookkeeping for the progress display and the per-step CSV.
struct StepLog {
  OutputFile csv;  // train_steps.csv, open on rank 0 only
  double window_loss = 0.0;
  int window_steps = 0;
};

// Rank 0's phase seconds per optimizer step, for `trainer bench`. StepTimes count this process's
// steps from 1, so a resumed run numbers them after the checkpoint's step.
struct StepTimesCsv {
  OutputFile file;  // open on rank 0 only
  int64_t first_step = 0;
};

// The allreduce_total phase spans from the first gradient bucket's launch (the reducer's observer
// opens it) to the end of the step's reduce (the step closes it).
struct AllreduceWindow {
  bool open = false;
};

// The loop's decisions between steps and epochs.
struct LoopState {
  bool done = false;                     // the run has reached total_steps or the target accuracy
  int stop_signal = 0;                   // the signal all ranks agreed to stop on; 0 = none
  std::function<double()> pending_stop;  // GPUs: the last step's stop-signal agreement, still on its way
  int64_t skipped_steps_reported = 0;    // a device loss scaler's skipped steps logged so far
  // GPUs at world size > 1: the one-element flag the agreement reduces, kept for the run. Refilling it
  // is safe: the next fill queues on the compute stream behind the read-back copy of the last value.
  Tensor stop_flag;
};

struct TrainingRun {
  TrainingRun(const Config& config, const TrainOptions& options);
  TrainingRun(const TrainingRun&) = delete;
  TrainingRun& operator=(const TrainingRun&) = delete;

  // ---- settings, read once
  const Config& config;
  const TrainOptions& options;
  const FaultInjection faults;  // TRAINER_TEST_* hooks
  const TrainerBuild build;
  ProcessEnv env;
  Device device;
  PrecisionPolicy precision;
  DistOptions dist_options;

  // ---- processes
  std::unique_ptr<ProcessGroup> pg;
  std::optional<DescribeRanksOnFailure> describe_ranks_on_failure;
  int rank = 0;
  int world = 1;
  bool writer = false;             // rank 0: writes checkpoints, the summary and the shared files
  Heartbeat* heartbeat = nullptr;  // tells the other ranks where this one is; null at world size 1
  RunPaths paths;
  // Rank 0 holds train.run_dir (and a checkpoint.dir of its own) for the run's whole life.
  std::optional<DirectoryLock> run_dir_lock, ckpt_dir_lock;
  Log& log;

  // ---- model, optimizer, gradients
  Experiment experiment;
  bool average_bn_stats = false;  // without SyncBN: average the ranks' BN running statistics
  ZeroOptimizer* zero = nullptr;  // dist.zero_stage > 0; null otherwise
  std::optional<GradientReducer> ddp_reducer;
  GradientReducer* reducer = nullptr;  // the DDP reducer, or ZeRO stage 2's own

  // ---- observability
  std::unique_ptr<Exporter> exporter;
  std::optional<GpuUtilization> gpu_utilization;
  std::optional<PeriodicReader> gpu_utilization_reader;
  std::optional<StepTimer> timer;
  AllreduceWindow allreduce;

  // ---- where to start, and what is written as the run goes
  std::optional<CheckpointManager> checkpoints;
  TrainingState st;
  StepLog steps;  // rank 0's losses only (each rank's loss is of its own shard; the weights are the same)
  StepTimesCsv step_times;
  EpochMetricsCsv epoch_csv;  // rank 0's metrics.csv (metrics/run_csv.h)

  // ---- the step
  std::optional<LossScaler> scaler;
  WaitCheck comm_failed;                   // several GPUs: device waits poll the communicator's failure
  std::unique_ptr<HostReadback> readback;  // losses (and the stop agreement) come back asynchronously
  std::vector<Variable> params;
  std::optional<StepParts> parts;  // what the step function works on
  std::optional<DistributedSampler> sampler;
  RunSummary summary;
  LoopState loop;
  std::optional<StepFence> fence;  // GPUs: the host stays at most one step ahead of the device
  // train.cuda_graph: the captured step; null when every step runs eagerly. Declared last: it goes
  // before the process group (leave_process_group, and the destructor's order).
  std::unique_ptr<StepGraph> step_graph;
};

// Builds the run: processes and device, run directory and log, model and optimizer, metrics, the start
// point (fresh or a checkpoint), the loss scaler and the step.
std::unique_ptr<TrainingRun> start_run(const Config& config, const TrainOptions& options);

}  // namespace trainer

namespace trainer {

// The largest of one integer over all ranks (no communication at world size 1).
int64_t max_over_ranks(ProcessGroup& pg, int64_t local);

}  // namespace trainer
