#pragma once
// Checkpoints that survive crashes. A checkpoint is a directory <checkpoint.dir>/step-<8 digits>/:
//   model.safetensors      parameters and buffers under torchvision's names (loads into PyTorch)
//   optimizer.safetensors  optimizer state (momentum buffers, Adam moments, per-parameter steps)
//   config.toml            the resolved config of the run
//   ema.safetensors        the weight average (ema.enabled), under the model's names; its counts are
//                          the manifest's [ema] table
//   checkpoint.toml        the manifest: training position, RNG states, and size + CRC-32C per file,
//                          the model card (class names, eval transform: app/run/model_card.h);
//                          its first line is the CRC-32C of the rest (manifest_crc32c)
// Each tensor's CRC-32C is also in its safetensors metadata, so a corrupt tensor is named. The
// manifest's position is range-checked too (its step against the directory's name, and against the
// data it resumes: check_position_fits), so a manifest edited or damaged into a valid-looking one is
// refused instead of silently skipping part of an epoch.
//
// Writing: everything goes into a hidden temp directory, each file is fsynced, the directory is
// renamed into place and its parent fsynced. A crash or a full disk therefore never leaves a
// half-written checkpoint under a final name, and the previous checkpoints are untouched. Only the
// writer (rank 0) calls save(); other ranks wait for it at a barrier.
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "app/run/model_card.h"
#include "nn/modules/module.h"
#include "nn/optim/ema.h"
#include "nn/optim/optimizer.h"
#include "nn/safetensors.h"

namespace trainer {

// Where a final (or at-signal) checkpoint goes, inside the run directory, when checkpoint.dir cannot
// take it; --resume auto looks there too.
inline constexpr const char* kRescuedCheckpointsDir = "rescued-checkpoints";

class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Where training stands, everything besides the tensors that an exact resume needs.
struct TrainingState {
  int64_t step = 0;            // optimizer steps done
  int64_t epoch = 0;           // epoch in progress (0-based)
  int64_t batch_in_epoch = 0;  // micro-batches of that epoch already consumed, per rank
  // Samples of the epoch's global order consumed before the current sharding began: 0, except after a
  // resume at another world size, where the rest of the epoch is re-sharded (see remap_world_size).
  int64_t epoch_sample_offset = 0;
  int64_t samples_seen = 0;  // over all ranks
  int world_size = 1;
  int64_t batch_size = 0;  // per rank, for remapping to another world size
  double train_seconds = 0.0;
  double best_accuracy = 0.0;
  double accuracy = -1.0;  // test top-1 measured right before this checkpoint; -1 = none
  // The same for the weight average (ema.enabled); -1 = none. keep_best ranks by it with
  // checkpoint.keep_best_on = "ema".
  double best_ema_accuracy = 0.0;
  double ema_accuracy = -1.0;
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
  // crash_before_rename_step: the test hook TRAINER_TEST_CRASH_BEFORE_RENAME (app/train/fault_injection.h);
  // -1: none.
  CheckpointManager(std::string dir, const CheckpointConfig& config, int64_t crash_before_rename_step = -1);

  // Writes step-<state.step> and prunes old ones (keep_last newest plus keep_best best). Throws
  // CheckpointError (after removing its temp directory) when anything fails, e.g. a full disk. The
  // model card, when given, goes into model.safetensors' metadata and the manifest; `ema` (may be
  // null): the weight average, written to ema.safetensors.
  std::string save(Module& model, const Optimizer& optimizer, const TrainingState& state,
                   const std::string& config_toml, const std::optional<ModelCard>& card = std::nullopt,
                   const ModelEma* ema = nullptr);
  const std::string& dir() const { return dir_; }
  // Removes temp directories (".step-*.tmp") left by a writer that died before its rename; they are
  // never candidates for resuming. Returns their paths, for the log.
  std::vector<std::string> remove_stale_temps();

 private:
  void prune();
  std::string dir_;
  CheckpointConfig config_;
  int64_t crash_before_rename_step_ = -1;
};

// The bytes one checkpoint of `model` and `optimizer` takes on disk: weights, optimizer state (at its
// full size even before the first step allocates it), the config text and the manifest, each file
// rounded up to whole file-system blocks. Rank 0 checks at start that checkpoint.dir holds two.
// with_ema: the weight average's file too (the model's state once more).
int64_t checkpoint_bytes(Module& model, const Optimizer& optimizer, size_t config_bytes,
                         bool with_ema = false);

// Checks a checkpoint directory: the manifest matches its CRC-32C and parses, its step is the one in
// the directory's name and no count is negative, every file has its recorded size and CRC-32C, and
// every tensor its recorded CRC. Throws CheckpointError naming the file (and field or tensor).
TrainingState verify_checkpoint(const std::string& path);

// What the resumed run's data and config allow a checkpoint's position to be.
struct ResumeLimits {
  int64_t dataset_size = 0;  // training samples
  bool drop_last = false;    // data.drop_last
  int64_t epochs = 0;        // train.epochs
};
// Throws CheckpointError naming the checkpoint's manifest and the field unless the state's position is
// inside the run: epoch <= train.epochs (equal: the run is complete), epoch_sample_offset <= the
// dataset, batch_in_epoch <= the batches of the epoch at the checkpoint's world size and batch size
// (equal: the epoch's steps are done, its evaluation is not).
void check_position_fits(const TrainingState& state, const std::string& checkpoint_path,
                         const ResumeLimits& limits);

// The newest checkpoint in `dir` that verifies (and fits `limits`, when given); broken ones are skipped
// and described in `skipped`.
std::optional<CheckpointInfo> find_latest_checkpoint(const std::string& dir,
                                                     std::vector<std::string>* skipped,
                                                     const ResumeLimits* limits = nullptr);

// Moves a mid-epoch position written by state.world_size ranks onto `world_size` ranks of `batch_size`
// samples each, with DistributedSampler semantics: the epoch's global order does not depend on the
// world size, and the samples consumed so far are a prefix of it (rank r took positions r, r + W, ...
// batch by batch). The rest of the epoch is that order from the first unseen sample on, re-sharded
// over the new ranks: every sample of the epoch is seen exactly once, but batches are composed
// differently from a run that never changed size, so the continuation is not bit-exact. The step
// (the LR schedule's position, built for the new world size) becomes the global samples seen over the
// new global batch (batch_size x world_size x grad_accum_steps). Sets epoch_sample_offset,
// batch_in_epoch = 0, step, world_size and batch_size; returns a line for the log.
std::string remap_world_size(TrainingState& state, int64_t dataset_size, bool drop_last, int world_size,
                             int64_t batch_size, int grad_accum_steps);

// Verifies and loads a checkpoint into model and optimizer (and `ema`, when not null: from the
// checkpoint's average, or, for a checkpoint written without one, a fresh average of the loaded weights
// whose first update copies them); returns its state.
TrainingState load_checkpoint(const std::string& path, Module& model, Optimizer& optimizer,
                              ModelEma* ema = nullptr);

// Each tensor's CRC-32C as safetensors metadata ("crc32c.<name>": 8 hex digits), which every safetensors
// file the trainer writes carries (checkpoints, final.safetensors, --dump-logits).
SafetensorsMetadata tensor_crc_metadata(const std::vector<std::pair<std::string, Tensor>>& tensors);

// The model's weights alone (checkpoints/final.safetensors), with their CRC-32Cs and the model card.
void save_weights(const std::string& path, Module& model,
                  const std::optional<ModelCard>& card = std::nullopt);

// Whether loading weights checks the CRC-32Cs they carry (trainer eval --no-verify-crc skips it).
enum class CrcCheck { verify, skip };

// Loads weights (a file save_weights or a checkpoint wrote, or a foreign one such as a torchvision
// export) into `model`. With CrcCheck::verify a file that carries CRC-32Cs must match them: a corrupt
// tensor throws CheckpointError naming the tensor and the file. A file that carries none loads
// unverified. Returns a line for the user saying what was (not) verified.
std::string load_weights(const std::string& path, Module& model, CrcCheck check);
// The same from a file already read (read_safetensors): `trainer predict` and `export` read it once.
std::string load_weights(SafetensorsFile weights, Module& model, CrcCheck check);

// What tells one checkpoint's contents from another's, wherever it is stored: the CRC-32C of its
// manifest, which holds its state and every file's CRC. Copies of one checkpoint on two nodes agree.
std::string checkpoint_identity(const std::string& path);

}  // namespace trainer
