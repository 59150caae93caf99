// The repeated-augmentation sampler (data/repeated_aug_sampler.h): DeiT's counts, every rank the same
// count (the step-count invariant), each sample's copies on different ranks, determinism per (seed,
// epoch), and the ranks' lists against a Python transcription of DeiT's RASampler.
#include "data/repeated_aug_sampler.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "data/distributed_sampler.h"

namespace trainer {
namespace {

using Indices = std::vector<int64_t>;

std::vector<Indices> ranks(int64_t n, int world, int repeats, int64_t epoch = 0, uint64_t seed = 7,
                           bool shuffle = true) {
  std::vector<Indices> result;
  for (int rank = 0; rank < world; ++rank) {
    RepeatedAugSampler sampler(n, world, rank, shuffle, seed, repeats);
    sampler.set_epoch(epoch);
    result.push_back(sampler.indices());
  }
  return result;
}

TEST(RepeatedAugSampler, CountsFollowDeiT) {
  // DeiT: num_selected_samples = floor(n // 256 * 256 / world), num_samples = ceil(n * k / world).
  RepeatedAugSampler a(60000, 3, 0, true, 0, 3);
  EXPECT_EQ(a.num_samples(), 59904 / 3);
  EXPECT_EQ(a.total_size(), 180000);
  RepeatedAugSampler b(1000, 8, 5, true, 0, 3);
  EXPECT_EQ(b.num_samples(), 768 / 8);
  EXPECT_EQ(b.total_size(), 3000);
  RepeatedAugSampler c(1001, 3, 0, true, 0, 2);
  EXPECT_EQ(c.num_samples(), 768 / 3);  // 256: floor(768 / 3)
  EXPECT_EQ(c.total_size(), 2004);      // ceil(2002 / 3) * 3: padded
}

// The invariant the project guarantees: every rank runs the same number of steps.
TEST(RepeatedAugSampler, EveryRankGetsTheSameCount) {
  for (int world : {1, 2, 3, 4, 7, 8})
    for (int repeats : {1, 2, 3, 4})
      for (int64_t n : {int64_t{2048}, int64_t{3001}, int64_t{60000}}) {
        if (n / 256 * 256 / world < 1) continue;
        const std::vector<Indices> all = ranks(n, world, repeats);
        for (const Indices& r : all) {
          EXPECT_EQ(r.size(), all[0].size()) << n << " " << world << " " << repeats;
          EXPECT_EQ(static_cast<int64_t>(r.size()), n / 256 * 256 / world);
          for (int64_t i : r) ASSERT_TRUE(i >= 0 && i < n);
        }
      }
}

// Copies of a sample sit side by side in the repeated list, so with world >= repeats they go to
// different ranks: no rank sees a sample twice (before the padding).
TEST(RepeatedAugSampler, CopiesOfASampleLandOnDifferentRanks) {
  const std::vector<Indices> all = ranks(4096, 4, 3);
  std::map<int64_t, int> copies;
  for (const Indices& r : all) {
    const std::set<int64_t> distinct(r.begin(), r.end());
    EXPECT_EQ(distinct.size(), r.size());
    for (int64_t i : r) ++copies[i];
  }
  int three = 0;
  for (const auto& [index, count] : copies) {
    EXPECT_LE(count, 3);
    three += count == 3;
  }
  EXPECT_GT(three, 1000);  // most kept samples come with all their copies
}

TEST(RepeatedAugSampler, DeterministicPerSeedAndEpochAndSharesTheDistributedOrder) {
  EXPECT_EQ(ranks(3000, 2, 3, 4, 11), ranks(3000, 2, 3, 4, 11));  // a resumed run deals the same list
  EXPECT_NE(ranks(3000, 2, 3, 4, 11), ranks(3000, 2, 3, 5, 11));
  EXPECT_NE(ranks(3000, 2, 3, 4, 11), ranks(3000, 2, 3, 4, 12));
  RepeatedAugSampler ra(3000, 2, 0, true, 11, 3);
  DistributedSampler plain(3000, 2, 0, true, 11, true);
  ra.set_epoch(4);
  plain.set_epoch(4);
  EXPECT_EQ(ra.permutation(), plain.permutation());
  // repeats = 1 deals the plain order, strided over the ranks, cut to DeiT's count.
  RepeatedAugSampler once(3000, 2, 1, false, 0, 1);
  const Indices got = once.indices();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], static_cast<int64_t>(2 * i + 1));
}

TEST(RepeatedAugSampler, RefusesWhatLeavesARankNothing) {
  EXPECT_THROW(RepeatedAugSampler(255, 1, 0, true, 0, 3), std::invalid_argument);
  EXPECT_THROW(RepeatedAugSampler(1000, 8, 8, true, 0, 3), std::invalid_argument);
  EXPECT_THROW(RepeatedAugSampler(1000, 2, 0, true, 0, 0), std::invalid_argument);
}

void write_list(std::ofstream& out, const Indices& v) {
  out << "[";
  for (size_t i = 0; i < v.size(); ++i) out << (i ? "," : "") << v[i];
  out << "]";
}

// Each rank's list, and their union, equal DeiT's RASampler (scripts/ra_sampler_reference.py, a
// transcription of deit/samplers.py) given the same epoch order, over world sizes, repeats and sizes
// that pad, shuffled or not.
TEST(RepeatedAugSampler, RanksMatchATranscriptionOfDeiTsRASampler) {
  if (std::system("python3 -c pass > /dev/null 2>&1") != 0) GTEST_SKIP() << "python3 not found";
  const std::string path =
      (std::filesystem::temp_directory_path() / ("ra_sampler_cases_" + std::to_string(::getpid()) + ".json"))
          .string();
  {
    std::ofstream out(path);
    out << "[";
    bool first = true;
    for (int world : {1, 2, 3, 4, 8})
      for (int repeats : {1, 2, 3, 5})
        for (int64_t n : {int64_t{2049}, int64_t{4100}}) {
          RepeatedAugSampler order(n, world, 0, n % 2 == 0, 3, repeats);
          order.set_epoch(2);
          out << (first ? "" : ",") << "{\"world\":" << world << ",\"repeats\":" << repeats << ",\"order\":";
          first = false;
          write_list(out, order.permutation());
          out << ",\"ranks\":[";
          const std::vector<Indices> all = ranks(n, world, repeats, 2, 3, n % 2 == 0);
          for (size_t r = 0; r < all.size(); ++r) {
            out << (r ? "," : "");
            write_list(out, all[r]);
          }
          out << "]}";
        }
    out << "]";
  }
  const std::string command = "python3 " TRAINER_SOURCE_DIR "/scripts/ra_sampler_reference.py " + path;
  const int status = std::system(command.c_str());
  std::filesystem::remove(path);
  EXPECT_EQ(status, 0) << command;
}

}  // namespace
}  // namespace trainer
