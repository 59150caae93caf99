#pragma once
// Which dataset indices each rank reads, with the semantics of torch.utils.data.DistributedSampler,
// for training: every rank gets the same number of samples, so every rank runs the same number of
// steps and no collective waits forever on a rank that ran out of data.
//
// The epoch's order is a function of (seed, epoch) only, never of the rank, so ranks agree on it
// without talking. Then, like PyTorch:
//   drop_last = true:  the order is truncated to a multiple of world_size (the tail is skipped);
//   drop_last = false: it is padded to a multiple of world_size by repeating indices from its start,
//                      so a few samples are seen twice per epoch.
// Rank r takes positions r, r + W, r + 2W, ... of that list.
//
// The padding duplicates samples, so metrics computed over a DistributedSampler's shards are not
// exact. Evaluation must use EvalShard, which splits the dataset without padding or duplicates.
#include <cstdint>
#include <vector>

namespace trainer {

class DistributedSampler {
 public:
  // Throws std::invalid_argument unless 0 <= rank < world_size and dataset_size >= 0.
  DistributedSampler(int64_t dataset_size, int world_size, int rank, bool shuffle, uint64_t seed,
                     bool drop_last);

  // Call at the start of every epoch: without it every epoch repeats the same order.
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }

  int64_t dataset_size() const { return dataset_size_; }
  int world_size() const { return world_size_; }
  int rank() const { return rank_; }
  int64_t num_samples() const { return num_samples_; }               // per rank, equal on every rank
  int64_t total_size() const { return num_samples_ * world_size_; }  // over all ranks

  // The epoch's order over the whole dataset, before truncating, padding or sharding: a Fisher-Yates
  // shuffle of 0..n-1 with a Generator seeded from (seed, epoch), or 0..n-1 without shuffle.
  std::vector<int64_t> permutation() const;
  // This rank's num_samples() indices for the current epoch.
  std::vector<int64_t> indices() const { return indices_from(0); }
  // This rank's share of positions start..n-1 of the epoch's order, truncated or padded as above: the
  // rest of an epoch whose first `start` samples were consumed at another world size.
  std::vector<int64_t> indices_from(int64_t start) const;

 private:
  int64_t dataset_size_;
  int world_size_;
  int rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t epoch_ = 0;
  int64_t num_samples_;
};

// A contiguous slice of the dataset for exact distributed evaluation: every index on exactly one rank,
// no padding, ranks in order (concatenating the shards in rank order gives 0..n-1). Shard sizes differ
// by at most one, so ranks must not assume equal batch counts: see max_count().
class EvalShard {
 public:
  EvalShard(int64_t dataset_size, int world_size, int rank);

  int64_t start() const { return start_; }
  int64_t count() const { return count_; }
  int64_t max_count() const { return max_count_; }  // the largest shard, for sizing gathers
  std::vector<int64_t> indices() const;             // start(), start() + 1, ..., start() + count() - 1

 private:
  int64_t start_ = 0;
  int64_t count_ = 0;
  int64_t max_count_ = 0;
};

// Batches in an epoch of num_samples: the last partial batch counts unless drop_last.
int64_t steps_per_epoch(int64_t num_samples, int64_t batch_size, bool drop_last);

}  // namespace trainer
