#pragma once
// `trainer train`: the training loop, from setup through the epochs to the summary. The run's parts are
// one TrainingRun, built by start_run() (app/train/training_run.h); one optimizer step (data, forward,
// backward, all-reduce, optimizer) is train_step() in app/train/train_step.h.
#include <string>

#include "app/config/config.h"

namespace trainer {

struct TrainOptions {
  std::string summary_path;  // --summary: JSON written at the end; empty = none
  std::string resume;        // --resume: "" (fresh run), "auto" (newest good checkpoint, if any) or a path
};

// Trains as `config` says; returns the process exit code (0, or 128 + signal after a checkpoint on
// SIGINT/SIGTERM). Throws ConfigError / DataError / CheckpointError / std::runtime_error with a
// message for the user on anything that stops the run.
int run_training(const Config& config, const TrainOptions& options);

}  // namespace trainer
