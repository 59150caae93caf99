#pragma once
// `trainer train`: the training loop, read top to bottom as the phases of a step.
#include <string>

#include "app/config.h"

namespace trainer {

struct TrainOptions {
  std::string summary_path;  // --summary: JSON written at the end; empty = none
};

// Trains as `config` says; returns the process exit code. Throws ConfigError / DataError /
// std::runtime_error with a message for the user on anything that stops the run.
int run_training(const Config& config, const TrainOptions& options);

}  // namespace trainer
