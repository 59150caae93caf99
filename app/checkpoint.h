#pragma once
// Checkpoints that survive crashes. A checkpoint is a directory <checkpoint.dir>/step-<8 digits>/:
//   model.safetensors      parameters and buffers under torchvision's names (loads into PyTorch)
//   optimizer.safetensors  optimizer state (momentum buffers, Adam moments, per-parameter steps)
//   config.toml            the resolved config of the run
//   checkpoint.toml        the manifest: training position, RNG states, and size + CRC-32C per file
// Each tensor's CRC-32C is also in its safetensors metadata, so a corrupt tensor is named.
//
// Writing: everything goes into a hidden temp directory, each file is fsynced, the directory is
// renamed into place and its parent fsynced. A crash or a full disk therefore never leaves a
// half-written checkpoint under a final name, and the previous checkpoints are untouched. Only the
// writer (rank 0) calls save(); other ranks wait for it at a barrier.
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "app/config.h"
#include "nn/modules/module.h"
#include "nn/optim/optimizer.h"

namespace trainer {

class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Where training stands, everything besides the tensors that an exact resume needs.
struct TrainingState {
  int64_t step = 0;            // optimizer steps done
  int64_t epoch = 0;           // epoch in progress (0-based)
  int64_t batch_in_epoch = 0;  // micro-batches of that epoch already consumed, per rank
  int64_t samples_seen = 0;    // over all ranks
  int world_size = 1;
  int64_t batch_size = 0;      // per rank, for remapping to another world size
  double train_seconds = 0.0;
  double best_accuracy = 0.0;
  double accuracy = -1.0;      // test top-1 measured right before this checkpoint; -1 = none
  double epoch_loss_sum = 0.0;
  int64_t epoch_steps = 0;
  double loss_scale = 0.0;  // fp16 LossScaler; 0 = none recorded
  int64_t loss_scale_growth_tracker = 0;
  std::vector<std::string> rng_states;  // one per rank (dropout generators)
  std::string run_dir;
};

struct CheckpointInfo {
  std::string path;
  TrainingState state;
};

class CheckpointManager {
 public:
  CheckpointManager(std::string dir, const CheckpointConfig& config);

  // Writes step-<state.step> and prunes old ones (keep_last newest plus keep_best best). Throws
  // CheckpointError (after removing its temp directory) when anything fails, e.g. a full disk.
  std::string save(Module& model, const Optimizer& optimizer, const TrainingState& state,
                   const std::string& config_toml);
  const std::string& dir() const { return dir_; }

 private:
  void prune();
  std::string dir_;
  CheckpointConfig config_;
};

// Checks a checkpoint directory: the manifest parses and every file has its recorded size and
// CRC-32C, and every tensor its recorded CRC. Throws CheckpointError naming the file (and tensor).
TrainingState verify_checkpoint(const std::string& path);

// The newest checkpoint in `dir` that verifies; broken ones are skipped and described in `skipped`.
std::optional<CheckpointInfo> find_latest_checkpoint(const std::string& dir, std::vector<std::string>* skipped);

// Verifies and loads a checkpoint into model and optimizer; returns its state.
TrainingState load_checkpoint(const std::string& path, Module& model, Optimizer& optimizer);

}  // namespace trainer
