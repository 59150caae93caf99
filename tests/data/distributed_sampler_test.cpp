#include "data/distributed_sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

namespace trainer {
namespace {

using Indices = std::vector<int64_t>;

std::vector<Indices> shards(int64_t size, int world, bool shuffle, bool drop_last, int64_t epoch = 0,
                            uint64_t seed = 7) {
  std::vector<Indices> result;
  for (int rank = 0; rank < world; ++rank) {
    DistributedSampler sampler(size, world, rank, shuffle, seed, drop_last);
    sampler.set_epoch(epoch);
    result.push_back(sampler.indices());
  }
  return result;
}

TEST(DistributedSampler, MatchesPyTorchWithoutShuffle) {
  // torch DistributedSampler(range(10), num_replicas=3, rank=r, shuffle=False, drop_last=...)
  EXPECT_EQ(shards(10, 3, false, true), (std::vector<Indices>{{0, 3, 6}, {1, 4, 7}, {2, 5, 8}}));
  EXPECT_EQ(shards(10, 3, false, false), (std::vector<Indices>{{0, 3, 6, 9}, {1, 4, 7, 0}, {2, 5, 8, 1}}));
  // Padding longer than the dataset repeats it whole: [0, 1] -> [0, 1, 0, 1, 0].
  EXPECT_EQ(shards(2, 5, false, false), (std::vector<Indices>{{0}, {1}, {0}, {1}, {0}}));
  EXPECT_EQ(shards(2, 5, false, true), (std::vector<Indices>(5)));
}

TEST(DistributedSampler, CountsMatchPyTorch) {
  for (const bool drop_last : {true, false}) {
    DistributedSampler sampler(10, 3, 1, true, 0, drop_last);
    EXPECT_EQ(sampler.num_samples(), drop_last ? 3 : 4);
    EXPECT_EQ(sampler.total_size(), drop_last ? 9 : 12);
    EXPECT_EQ(static_cast<int64_t>(sampler.indices().size()), sampler.num_samples());
  }
}

TEST(DistributedSampler, PaddingRepeatsThePermutationFromItsStart) {
  DistributedSampler rank1(10, 3, 1, true, 7, false), rank2(10, 3, 2, true, 7, false);
  const Indices order = rank1.permutation();
  EXPECT_EQ(rank1.indices().back(), order[0]);  // position 10
  EXPECT_EQ(rank2.indices().back(), order[1]);  // position 11
}

// The rest of an epoch after a world-size change: positions start..n-1 of the same order, sharded and
// truncated or padded by the same rules as a whole epoch.
TEST(DistributedSampler, IndicesFromShardsTheRestOfTheOrder) {
  DistributedSampler r0(10, 3, 0, false, 7, false), r1(10, 3, 1, false, 7, false), r2(10, 3, 2, false, 7, true);
  EXPECT_EQ(r0.indices_from(0), r0.indices());
  EXPECT_EQ(r0.indices_from(4), (Indices{4, 7}));  // 6 left: 4..9, rank 0 takes positions 4 and 7
  EXPECT_EQ(r1.indices_from(5), (Indices{6, 9}));  // 5 left, padded to 6 (rank 2 repeats 5)
  EXPECT_EQ(r2.indices_from(5), (Indices{7}));        // drop_last: 5 left -> 3, the tail is skipped
  EXPECT_TRUE(r0.indices_from(10).empty());
  EXPECT_THROW(r0.indices_from(11), std::invalid_argument);
  DistributedSampler shuffled(100, 2, 1, true, 3, false);
  const Indices order = shuffled.permutation();
  EXPECT_EQ(shuffled.indices_from(60).front(), order[61]);
}

TEST(DistributedSampler, ShardsAreDisjointAndCoverTheDataset) {
  for (const int64_t size : {12, 13, 100, 1001}) {
    const int world = 4;
    const std::vector<Indices> parts = shards(size, world, true, true);
    std::set<int64_t> seen;
    int64_t total = 0;
    for (const Indices& part : parts) {
      EXPECT_EQ(part.size(), parts[0].size());
      seen.insert(part.begin(), part.end());
      total += static_cast<int64_t>(part.size());
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), total) << "duplicates with drop_last, size " << size;
    EXPECT_EQ(total, size / world * world);

    const std::vector<Indices> padded = shards(size, world, true, false);
    std::set<int64_t> covered;
    for (const Indices& part : padded) covered.insert(part.begin(), part.end());
    EXPECT_EQ(static_cast<int64_t>(covered.size()), size) << "padded shards miss samples, size " << size;
  }
}

TEST(DistributedSampler, PermutationIsSharedByRanksAndChangesWithEpochAndSeed) {
  DistributedSampler rank0(1000, 4, 0, true, 42, false), rank3(1000, 4, 3, true, 42, false);
  rank0.set_epoch(5);
  rank3.set_epoch(5);
  const Indices order = rank0.permutation();
  EXPECT_EQ(order, rank3.permutation());

  Indices sorted = order;
  std::sort(sorted.begin(), sorted.end());
  Indices identity(1000);
  std::iota(identity.begin(), identity.end(), int64_t{0});
  EXPECT_EQ(sorted, identity);
  EXPECT_NE(order, identity);

  rank0.set_epoch(6);
  EXPECT_NE(rank0.permutation(), order);
  rank0.set_epoch(5);
  EXPECT_EQ(rank0.permutation(), order);
  DistributedSampler other_seed(1000, 4, 0, true, 43, false);
  other_seed.set_epoch(5);
  EXPECT_NE(other_seed.permutation(), order);
}

TEST(DistributedSampler, RejectsBadRanks) {
  EXPECT_THROW(DistributedSampler(10, 2, 2, true, 0, false), std::invalid_argument);
  EXPECT_THROW(DistributedSampler(10, 0, 0, true, 0, false), std::invalid_argument);
  EXPECT_THROW(EvalShard(10, 2, -1), std::invalid_argument);
}

TEST(EvalShard, CoversEveryIndexExactlyOnceInRankOrder) {
  for (const int64_t size : {0, 1, 2, 10, 97}) {
    for (const int world : {1, 3, 4, 8}) {
      Indices all;
      int64_t smallest = size, largest = 0;
      for (int rank = 0; rank < world; ++rank) {
        const EvalShard shard(size, world, rank);
        const Indices part = shard.indices();
        EXPECT_EQ(static_cast<int64_t>(part.size()), shard.count());
        EXPECT_LE(shard.count(), shard.max_count());
        smallest = std::min(smallest, shard.count());
        largest = std::max(largest, shard.count());
        all.insert(all.end(), part.begin(), part.end());
      }
      Indices identity(static_cast<size_t>(size));
      std::iota(identity.begin(), identity.end(), int64_t{0});
      EXPECT_EQ(all, identity) << size << " over " << world;
      EXPECT_LE(largest - smallest, 1);
      EXPECT_EQ(EvalShard(size, world, 0).max_count(), largest);
    }
  }
  EXPECT_EQ(EvalShard(10, 3, 0).count(), 4);
  EXPECT_EQ(EvalShard(10, 3, 2).start(), 7);
}

TEST(StepsPerEpoch, CountsTheLastPartialBatchUnlessDropped) {
  EXPECT_EQ(steps_per_epoch(10, 4, false), 3);
  EXPECT_EQ(steps_per_epoch(10, 4, true), 2);
  EXPECT_EQ(steps_per_epoch(8, 4, false), 2);
  EXPECT_EQ(steps_per_epoch(3, 4, true), 0);
  EXPECT_THROW(steps_per_epoch(3, 0, true), std::invalid_argument);
}

}  // namespace
}  // namespace trainer

namespace trainer {
namespace {

// The property that keeps all-reduces from hanging: for every dataset length, world size, batch size
// and drop_last, every rank runs the same number of batches, and an epoch without padding covers each
// sample exactly once (with padding: at least once, duplicates only from the padding).
TEST(DistributedSampler, SweepEqualBatchCountsAndFullCoverage) {
  for (int64_t n : {1, 2, 3, 7, 10, 64, 101}) {
    for (int world = 1; world <= 4; ++world) {
      if (n < world) continue;
      for (bool drop_last : {false, true}) {
        for (int64_t batch : {1, 3, 8}) {
          std::vector<int> seen(static_cast<size_t>(n), 0);
          int64_t batches = -1;
          for (int rank = 0; rank < world; ++rank) {
            DistributedSampler s(n, world, rank, /*shuffle=*/true, /*seed=*/5, drop_last);
            s.set_epoch(3);
            const auto idx = s.indices();
            const int64_t b = steps_per_epoch(static_cast<int64_t>(idx.size()), batch, drop_last);
            if (batches < 0) batches = b;
            EXPECT_EQ(b, batches) << "n=" << n << " world=" << world << " rank=" << rank;
            for (int64_t i : idx) ++seen[static_cast<size_t>(i)];
          }
          const int64_t total = std::accumulate(seen.begin(), seen.end(), int64_t{0});
          if (drop_last) {
            EXPECT_EQ(total, n / world * world);
            for (int c : seen) EXPECT_LE(c, 1);
          } else {
            EXPECT_EQ(total, (n + world - 1) / world * world);
            for (int c : seen) EXPECT_GE(c, 1);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace trainer
