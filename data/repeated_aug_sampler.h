#pragma once
// Repeated augmentation (Hoffer et al. 2020; Berman et al. 2019) with the semantics of DeiT's
// RASampler: each sample is dealt `repeats` times per epoch, its copies side by side in the epoch's
// list, so with world_size >= repeats they land on different ranks (and get different random
// augmentations there). Then, like DeiT:
//   the list (each index of the epoch's order repeated `repeats` times) is padded from its start to
//   total_size = ceil(n * repeats / W) * W; rank r takes positions r, r + W, r + 2W, ...; and keeps the
//   first num_samples = floor(floor(n / 256) * 256 / W) of them,
// so an epoch has about as many steps as without repetition, and every rank the same count (the
// invariant that keeps the ranks' collectives in step).
//
// Where we differ from DeiT: the epoch's order is DistributedSampler's (a Fisher-Yates shuffle seeded
// from (seed, epoch), data/distributed_sampler.h), not torch.randperm seeded by the epoch alone, so
// train.seed changes it too. Given the same order, the ranks' indices are DeiT's exactly
// (tests/data/repeated_aug_sampler_test.cpp checks them against a transcription of RASampler).
//
// Deterministic per (seed, epoch): a resumed run deals the same list and the loader skips the batches
// already done (LoaderOptions::first_batch), as with DistributedSampler.
#include <cstdint>
#include <vector>

namespace trainer {

class RepeatedAugSampler {
 public:
  // Throws std::invalid_argument unless 0 <= rank < world_size, repeats >= 1 and the dataset holds at
  // least 256 * world_size samples (DeiT's rounding would leave a rank nothing otherwise).
  RepeatedAugSampler(int64_t dataset_size, int world_size, int rank, bool shuffle, uint64_t seed,
                     int repeats);

  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }
  int repeats() const { return repeats_; }
  int64_t num_samples() const { return num_samples_; }  // per rank, equal on every rank
  int64_t total_size() const;                           // the padded list's length, over all ranks

  // The epoch's order over the dataset before repetition (DistributedSampler::permutation()).
  std::vector<int64_t> permutation() const;
  // This rank's num_samples() indices for the current epoch.
  std::vector<int64_t> indices() const;

 private:
  int64_t dataset_size_;
  int world_size_;
  int rank_;
  bool shuffle_;
  uint64_t seed_;
  int repeats_;
  int64_t epoch_ = 0;
  int64_t num_samples_;
};

}  // namespace trainer
