#include "data/distributed_sampler.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

#include "data/hash.h"
#include "nn/random.h"

namespace trainer {

namespace {
void check_rank(int64_t dataset_size, int world_size, int rank, const char* who) {
  if (world_size < 1 || rank < 0 || rank >= world_size || dataset_size < 0) {
    throw std::invalid_argument(std::string(who) +
                                ": need 0 <= rank < world_size and dataset_size >= 0, got rank " +
                                std::to_string(rank) + ", world_size " + std::to_string(world_size) +
                                ", dataset_size " + std::to_string(dataset_size));
  }
}
}  // namespace

DistributedSampler::DistributedSampler(int64_t dataset_size, int world_size, int rank, bool shuffle,
                                       uint64_t seed, bool drop_last)
    : dataset_size_(dataset_size),
      world_size_(world_size),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last) {
  check_rank(dataset_size, world_size, rank, "DistributedSampler");
  // PyTorch: ceil((n - W) / W) == floor(n / W) when dropping the tail, ceil(n / W) when padding.
  num_samples_ = drop_last ? dataset_size / world_size : (dataset_size + world_size - 1) / world_size;
}

std::vector<int64_t> DistributedSampler::permutation() const {
  std::vector<int64_t> order(static_cast<size_t>(dataset_size_));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (!shuffle_) return order;
  Generator gen(mix_seed(seed_, static_cast<uint64_t>(epoch_)));
  for (size_t i = order.size(); i > 1; --i) {
    std::swap(order[i - 1], order[static_cast<size_t>(gen.below(i))]);
  }
  return order;
}

std::vector<int64_t> DistributedSampler::indices_from(int64_t start) const {
  if (start < 0 || start > dataset_size_)
    throw std::invalid_argument("DistributedSampler: start " + std::to_string(start) + " outside 0.." +
                                std::to_string(dataset_size_));
  const std::vector<int64_t> order = permutation();
  const int64_t n = dataset_size_ - start;
  const int64_t per_rank = drop_last_ ? n / world_size_ : (n + world_size_ - 1) / world_size_;
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(per_rank));
  // Position p of the padded list is order[start + p mod n]: repeating from the start as often as
  // needed, which is what PyTorch does (it repeats the whole list when padding exceeds the dataset size).
  for (int64_t p = rank_; p < per_rank * world_size_; p += world_size_) {
    mine.push_back(order[static_cast<size_t>(start + p % n)]);
  }
  return mine;
}

EvalShard::EvalShard(int64_t dataset_size, int world_size, int rank) {
  check_rank(dataset_size, world_size, rank, "EvalShard");
  // The first n mod W ranks take one extra sample.
  const int64_t base = dataset_size / world_size, extra = dataset_size % world_size;
  start_ = rank * base + std::min<int64_t>(rank, extra);
  count_ = base + (rank < extra ? 1 : 0);
  max_count_ = base + (extra > 0 ? 1 : 0);
}

std::vector<int64_t> EvalShard::indices() const {
  std::vector<int64_t> result(static_cast<size_t>(count_));
  std::iota(result.begin(), result.end(), start_);
  return result;
}

int64_t steps_per_epoch(int64_t num_samples, int64_t batch_size, bool drop_last) {
  if (batch_size < 1) throw std::invalid_argument("steps_per_epoch: batch_size must be positive");
  return drop_last ? num_samples / batch_size : (num_samples + batch_size - 1) / batch_size;
}

}  // namespace trainer
