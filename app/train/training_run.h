#pragma once
// TrainingRun: everything a `trainer train` run is made of, as a few owned parts that say what they are --
// the fixed context (settings, rank, device, precision policy), the processes, the run's files, the
// experiment (data, model, optimizer), the data-parallel machinery, the reporter (log, metrics, CSVs,
// summary), the checkpoints, the training state, the step's machinery and the loop's state. start_run()
// builds it in named phases; the loop (app/train/train_loop.cpp) passes each function the parts it uses.
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
#include "app/train/step_graph.h"
#include "app/train/summary.h"
#include "app/train/train_loop.h"
#include "data/distributed_sampler.h"
#include "data/repeated_aug_sampler.h"
#include "dist/data_parallel_step.h"
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
#include "nn/batch_mix.h"
#include "nn/modules/stochastic_depth.h"
#include "nn/training_loss.h"

namespace trainer {

// Who and where this process is: the settings (read once), this rank among the others, its device and
// the precision policy decided for it. Fixed before the processes connect; every part reads it.
struct RunContext {
  const Config& config;
  const TrainOptions& options;
  FaultInjection faults;  // TRAINER_TEST_* hooks
  TrainerBuild build;
  ProcessEnv env;
  Device device;
  PrecisionPolicy precision;
  DistOptions dist_options;

  int rank() const { return env.rank; }
  int world() const { return env.world_size; }
  bool writer() const { return env.rank == 0; }  // writes checkpoints, the summary and the shared files
};

// The job's processes: the process group, and what a failed collective's message says about the others.
struct Processes {
  std::unique_ptr<ProcessGroup> group;
  std::optional<DescribeRanksOnFailure> describe_ranks_on_failure;
  Heartbeat* heartbeat = nullptr;  // tells the other ranks where this one is; null at world size 1
};

// Where the run writes, decided once all ranks agree on it. Rank 0 holds train.run_dir (and a
// checkpoint.dir of its own) for the run's whole life.
struct RunFiles {
  std::string run_dir;
  std::string ckpt_dir;
  std::string config_toml;  // the resolved config, as every checkpoint stores it
  std::optional<DirectoryLock> run_dir_lock, ckpt_dir_lock;
};

// How gradients and statistics travel between the ranks.
struct DataParallel {
  bool average_bn_stats = false;  // without SyncBN: average the ranks' BN running statistics
  ZeroOptimizer* zero = nullptr;  // dist.zero_stage > 0; null otherwise
  std::optional<GradientReducer> ddp_reducer;
  GradientReducer* reducer = nullptr;  // the DDP reducer, or ZeRO stage 2's own
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

// What the run tells as it goes: the log, the exporter (Prometheus) and GPU utilisation, the phase
// timer, rank 0's CSVs and the summary.
struct Reporter {
  Log& log;
  std::unique_ptr<Exporter> exporter;
  std::optional<GpuUtilization> gpu_utilization;
  std::optional<PeriodicReader> gpu_utilization_reader;
  std::optional<StepTimer> timer;
  StepLog steps;  // rank 0's losses only (each rank's loss is of its own shard; the weights are the same)
  StepTimesCsv step_times;
  EpochMetricsCsv epoch_csv;  // rank 0's metrics.csv (metrics/run_csv.h)
  RunSummary summary;
};

// The step and what surrounds it on the device: its parts, the loss scaler, the losses' way back to the
// host, the fence that keeps the host at most one step ahead, the captured step.
struct StepMachinery {
  std::optional<LossScaler> scaler;
  WaitCheck comm_failed;                   // several GPUs: device waits poll the communicator's failure
  std::unique_ptr<HostReadback> readback;  // losses (and the stop agreement) come back asynchronously
  std::vector<Variable> params;
  std::optional<StepParts> parts;  // what the step function works on
  std::optional<StepFence> fence;  // GPUs: the host stays at most one step ahead of the device
  // train.cuda_graph: the captured step; null when every step runs eagerly. It goes before the process
  // group (leave_process_group, and the destructor's order).
  std::unique_ptr<StepGraph> graph;
  // Soft targets (mixup.*, train.loss = "bce"): the draws' device tensor and the loss the step forms
  // from them (parts->soft_loss points here); null / unused otherwise.
  std::unique_ptr<BatchMixer> mixer;
  TrainingLoss soft_loss;
  // Stochastic depth (ConvNeXt's drop path): its masks staged before each forward; null without.
  std::unique_ptr<DropPathStager> drop_path;
};

// The loop's decisions between steps and epochs.
struct LoopState {
  bool done = false;                     // the run has reached total_steps or the target accuracy
  int stop_signal = 0;                   // the signal all ranks agreed to stop on; 0 = none
  std::function<double()> pending_stop;  // GPUs: the last step's stop-signal agreement, still on its way
  int64_t skipped_steps_reported = 0;    // a device loss scaler's skipped steps logged so far
  // Whether model.freeze's parameters are frozen now; none before the first epoch sets it.
  std::optional<bool> frozen;
  // GPUs at world size > 1: the one-element flag the agreement reduces, kept for the run. Refilling it
  // is safe: the next fill queues on the compute stream behind the read-back copy of the last value.
  Tensor stop_flag;
};

// A `trainer train` run, made of its parts. Declared in the order they are built and so destroyed in
// reverse: the step (its CUDA graph) before the process group, the reducer before the communicator.
struct TrainingRun {
  TrainingRun(const Config& config, const TrainOptions& options);
  TrainingRun(const TrainingRun&) = delete;
  TrainingRun& operator=(const TrainingRun&) = delete;

  const RunContext context;
  Processes processes;
  RunFiles files;
  Experiment experiment;
  DataParallel data_parallel;
  Reporter reporter;
  std::optional<CheckpointManager> checkpoints;
  TrainingState state;  // where training is: step, epoch, samples, losses (what a checkpoint holds)
  StepMachinery step;
  std::optional<DistributedSampler> sampler;
  std::optional<RepeatedAugSampler> repeated_sampler;  // data.repeated_augmentations > 1: deals instead
  LoopState loop;
};

// The DDP reducer again, over the parameters that require a gradient now (model.freeze changed them),
// its first bucket's launch timed like the first one's. Not with ZeRO, whose shards are laid out once.
void rebuild_gradient_reducer(TrainingRun& run);

// Builds the run: processes and device, run directory and log, model and optimizer, metrics, the start
// point (fresh or a checkpoint), the loss scaler and the step.
std::unique_ptr<TrainingRun> start_run(const Config& config, const TrainOptions& options);

}  // namespace trainer

namespace trainer {

// The largest of one integer over all ranks (no communication at world size 1).
int64_t max_over_ranks(ProcessGroup& pg, int64_t local);

}  // namespace trainer
