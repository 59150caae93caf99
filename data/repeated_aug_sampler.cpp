#include "data/repeated_aug_sampler.h"

#include <stdexcept>
#include <string>

#include "data/distributed_sampler.h"

namespace trainer {

RepeatedAugSampler::RepeatedAugSampler(int64_t dataset_size, int world_size, int rank, bool shuffle,
                                       uint64_t seed, int repeats)
    : dataset_size_(dataset_size),
      world_size_(world_size),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      repeats_(repeats) {
  if (world_size < 1 || rank < 0 || rank >= world_size || repeats < 1 || dataset_size < 0)
    throw std::invalid_argument(
        "RepeatedAugSampler: need 0 <= rank < world_size, repeats >= 1 and "
        "dataset_size >= 0, got rank " +
        std::to_string(rank) + ", world_size " + std::to_string(world_size) + ", repeats " +
        std::to_string(repeats) + ", dataset_size " + std::to_string(dataset_size));
  // DeiT: int(math.floor(len(dataset) // 256 * 256 / num_replicas)).
  num_samples_ = dataset_size / 256 * 256 / world_size;
  if (num_samples_ < 1)
    throw std::invalid_argument(
        "RepeatedAugSampler: " + std::to_string(dataset_size) + " samples over " +
        std::to_string(world_size) +
        " ranks leave each rank none (DeiT keeps floor(n / 256) * 256 / world_size "
        "per rank). HINT: set data.repeated_augmentations = 1 for so small a dataset");
}

int64_t RepeatedAugSampler::total_size() const {
  const int64_t repeated = dataset_size_ * repeats_;
  return (repeated + world_size_ - 1) / world_size_ * world_size_;  // DeiT: ceil(n * k / W) * W
}

std::vector<int64_t> RepeatedAugSampler::permutation() const {
  DistributedSampler order(dataset_size_, 1, 0, shuffle_, seed_, true);
  order.set_epoch(epoch_);
  return order.permutation();
}

std::vector<int64_t> RepeatedAugSampler::indices() const {
  const std::vector<int64_t> order = permutation();
  const int64_t repeated = dataset_size_ * repeats_;
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  // Position p of the padded list is position p mod (n * k) of the repeated one (DeiT pads with the
  // list's start), whose entry is order[q / k] (torch.repeat_interleave). Only the first num_samples
  // positions of this rank are kept.
  for (int64_t p = rank_; static_cast<int64_t>(mine.size()) < num_samples_; p += world_size_)
    mine.push_back(order[static_cast<size_t>(p % repeated / repeats_)]);
  return mine;
}

}  // namespace trainer
