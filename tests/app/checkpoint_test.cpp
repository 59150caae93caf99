#include "app/run/checkpoint.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "app/common/crc32c.h"
#include "app/train/run_start.h"
#include "data/distributed_sampler.h"
#include "dist/multi_process.h"
#include "dist/store.h"
#include "nn/models/registry.h"
#include "nn/optim/adamw.h"
#include "nn/optim/sgd.h"
#include "tiny_mlp.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

TEST(Crc32c, KnownVectors) {
  // RFC 3720 test vectors for CRC-32C.
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  const std::vector<uint8_t> zeros(32, 0), ones(32, 0xff);
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  // Incremental equals one shot.
  EXPECT_EQ(crc32c("6789", 4, crc32c("12345", 5)), 0xE3069283u);
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("trainer_ckpt_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    model_ = testing::tiny_mlp();
    SgdOptions so;
    so.momentum = 0.9;
    opt_ = std::make_unique<Sgd>(model_->named_parameters(), so);
    for (auto& p : model_->parameters()) p.grad() = Tensor::full(p.shape(), 0.5);
    opt_->step();  // momentum buffers now exist
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string save(int64_t step, double accuracy = -1, int keep_last = 3, int keep_best = 0,
                   int64_t crash_before_rename_step = -1) {
    CheckpointConfig c;
    c.keep_last = keep_last;
    c.keep_best = keep_best;
    CheckpointManager m(dir_.string(), c, crash_before_rename_step);
    TrainingState s;
    s.step = step;
    s.epoch = 1;
    s.batch_in_epoch = 7;
    s.accuracy = accuracy;
    s.rng_states = {"rng state with spaces 123"};
    return m.save(*model_, *opt_, s, "[train]\nepochs = 2\n");
  }

  fs::path dir_;
  std::shared_ptr<Module> model_;
  std::unique_ptr<Optimizer> opt_;
};

TEST_F(CheckpointTest, RoundTripRestoresModelOptimizerAndState) {
  const std::string path = save(42);
  EXPECT_TRUE(fs::exists(fs::path(path) / "model.safetensors"));
  const auto before = model_->parameters()[0].data().to_vector<float>();
  const auto opt_before = opt_->state_tensors();
  // Disturb everything, then load.
  for (auto& p : model_->parameters()) p.data().fill_(0.0);
  for (auto& p : model_->parameters()) p.grad() = Tensor::full(p.shape(), 1.0);
  opt_->step();
  TrainingState s = load_checkpoint(path, *model_, *opt_);
  EXPECT_EQ(s.step, 42);
  EXPECT_EQ(s.epoch, 1);
  EXPECT_EQ(s.batch_in_epoch, 7);
  ASSERT_EQ(s.rng_states.size(), 1u);
  EXPECT_EQ(s.rng_states[0], "rng state with spaces 123");
  EXPECT_EQ(model_->parameters()[0].data().to_vector<float>(), before);
  const auto opt_after = opt_->state_tensors();
  ASSERT_EQ(opt_after.size(), opt_before.size());
  for (size_t i = 0; i < opt_after.size(); ++i)
    EXPECT_EQ(opt_after[i].second.to_vector<double>(), opt_before[i].second.to_vector<double>())
        << opt_after[i].first;
}

TEST_F(CheckpointTest, KeepLastAndKeepBestPrune) {
  save(1, 0.50, 2, 1);
  save(2, 0.90, 2, 1);
  save(3, 0.60, 2, 1);
  save(4, 0.70, 2, 1);
  std::vector<std::string> names;
  for (const auto& d : fs::directory_iterator(dir_)) names.push_back(d.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"step-00000002", "step-00000003", "step-00000004"}));
}

// Byte offset of the first data byte of tensor `name` in a safetensors file: 8 + header length +
// begin of its data_offsets (the header is JSON; we only need this one field).
int64_t tensor_data_offset(const fs::path& file, const std::string& name) {
  std::ifstream in(file, std::ios::binary);
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  std::string header(header_len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));
  const size_t at = header.find("\"" + name + "\"");
  const size_t offsets = header.find("data_offsets", at);
  EXPECT_NE(at, std::string::npos) << name;
  const size_t open = header.find('[', offsets);
  return 8 + static_cast<int64_t>(header_len) + std::atoll(header.c_str() + open + 1);
}

TEST_F(CheckpointTest, FlippedBytesInATensorAreCaughtAndTheTensorIsNamed) {
  const std::string path = save(5);
  const fs::path model = fs::path(path) / "model.safetensors";
  const std::string victim = model_->state_dict().front().name;
  {  // flip one bit inside that tensor's data
    std::fstream f(model, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(tensor_data_offset(model, victim) + 1);
    const char c = static_cast<char>(f.get());
    f.seekp(tensor_data_offset(model, victim) + 1);
    f.put(static_cast<char>(c ^ 0x10));
  }
  try {
    verify_checkpoint(path);
    FAIL() << "corruption not detected";
  } catch (const CheckpointError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("model.safetensors"), std::string::npos) << what;
    EXPECT_NE(what.find("tensor '" + victim + "'"), std::string::npos) << what;
    EXPECT_NE(what.find("CRC"), std::string::npos) << what;
  }
  std::vector<std::string> skipped;
  EXPECT_FALSE(find_latest_checkpoint(dir_.string(), &skipped).has_value());
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find(victim), std::string::npos) << skipped[0];
  fs::resize_file(model, fs::file_size(model) - 100);
  EXPECT_THROW(verify_checkpoint(path), CheckpointError);
}

TEST_F(CheckpointTest, OptimizerStateCorruptionNamesTheTensorToo) {
  const std::string path = save(6);
  const fs::path file = fs::path(path) / "optimizer.safetensors";
  const std::string victim = opt_->state_tensors().back().first;
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(tensor_data_offset(file, victim));
    f.put('\x5a');
  }
  try {
    verify_checkpoint(path);
    FAIL() << "corruption not detected";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor '" + victim + "'"), std::string::npos) << e.what();
  }
}

// --resume auto at several ranks: rank 0 picks the checkpoint and the others take its choice, so a
// node whose listing of the shared directory is stale (NFS caches them; here a copy of the directory
// as it was before the newest checkpoint) resumes from the same one instead of stopping the run at
// the start agreement. One rank (no store) decides from its own view; other --resume values pass.
TEST_F(CheckpointTest, ResumeAutoIsRankZerosChoice) {
  save(1);
  const fs::path stale = dir_.string() + "_stale";
  fs::remove_all(stale);
  fs::copy(dir_, stale, fs::copy_options::recursive);
  const std::string newest = save(2);
  Log& log = Log::instance();
  trainer::testing::ThreadWorld world(2);  // rank 0's store and rank 1's connection to it
  const std::unique_ptr<TcpStore> rank1_connection = world.client();
  TcpStore &rank0_store = *world.server, &rank1_store = *rank1_connection;
  std::string rank1_choice;
  std::thread rank1([&] {
    rank1_choice = agreed_resume("auto", stale.string(), 1, &rank1_store, std::chrono::seconds(30), log);
  });
  const std::string rank0_choice =
      agreed_resume("auto", dir_.string(), 0, &rank0_store, std::chrono::seconds(30), log);
  rank1.join();
  EXPECT_EQ(rank0_choice, newest);
  EXPECT_EQ(rank1_choice, newest);
  EXPECT_EQ(agreed_resume("auto", stale.string(), 0, nullptr, std::chrono::seconds(1), log),
            (stale / "step-00000001").string());
  EXPECT_EQ(agreed_resume("", dir_.string(), 1, &rank1_store, std::chrono::seconds(1), log), "");
  EXPECT_EQ(agreed_resume(newest, stale.string(), 1, &rank1_store, std::chrono::seconds(1), log), newest);
  fs::remove_all(stale);
}

// Rank 0 failing to look (here an entry that is a symbolic-link loop; on NFS, a stale handle) tells the
// others why at once, instead of leaving them to wait out the timeout for its choice.
TEST_F(CheckpointTest, ResumeAutoFailingOnRankZeroStopsTheOthersWithItsReason) {
  Log& log = Log::instance();
  trainer::testing::ThreadWorld world(2);  // rank 0's store and rank 1's connection to it
  const std::unique_ptr<TcpStore> rank1_connection = world.client();
  TcpStore &rank0_store = *world.server, &rank1_store = *rank1_connection;
  const fs::path unreadable = dir_ / "looping";
  fs::create_directories(unreadable);
  fs::create_directory_symlink(unreadable / "step-00000009", unreadable / "step-00000009");
  std::string rank1_error;
  std::thread rank1([&] {
    try {
      agreed_resume("auto", dir_.string(), 1, &rank1_store, std::chrono::seconds(60), log);
    } catch (const std::exception& e) {
      rank1_error = e.what();
    }
  });
  EXPECT_ANY_THROW(
      agreed_resume("auto", unreadable.string(), 0, &rank0_store, std::chrono::seconds(60), log));
  rank1.join();
  EXPECT_NE(rank1_error.find("--resume auto: rank 0 could not choose a checkpoint"), std::string::npos)
      << rank1_error;
  EXPECT_NE(rank1_error.find("Too many levels of symbolic links"), std::string::npos) << rank1_error;
}

// The process really dies (SIGKILL from the test hook) after the checkpoint is complete in its temp
// directory and before the rename: the previous checkpoint stays the newest that verifies and loads,
// and the temp directory is never taken for a checkpoint; remove_stale_temps() clears it.
TEST_F(CheckpointTest, CrashBeforeRenameLeavesTheLastGoodCheckpoint) {
  const std::string good = save(1);
  const auto weights = model_->parameters()[0].data().to_vector<float>();
  for (auto& p : model_->parameters()) p.data().fill_(3.0);  // what the lost checkpoint would hold
  EXPECT_EXIT(
      {
        // TRAINER_TEST_CRASH_BEFORE_RENAME=2, as the trainer reads it at start-up
        // (app/train/fault_injection.h)
        save(2, -1, 3, 0, /*crash_before_rename_step=*/2);
        std::_Exit(0);  // not reached
      },
      ::testing::KilledBySignal(SIGKILL), "");
  EXPECT_TRUE(fs::exists(dir_ / ".step-00000002.tmp"));
  EXPECT_FALSE(fs::exists(dir_ / "step-00000002"));
  std::vector<std::string> skipped;
  auto latest = find_latest_checkpoint(dir_.string(), &skipped);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->path, good);
  EXPECT_TRUE(skipped.empty());
  load_checkpoint(latest->path, *model_, *opt_);
  EXPECT_EQ(model_->parameters()[0].data().to_vector<float>(), weights);

  CheckpointManager manager(dir_.string(), CheckpointConfig{});
  const std::vector<std::string> removed = manager.remove_stale_temps();
  ASSERT_EQ(removed.size(), 1u);
  EXPECT_EQ(fs::path(removed[0]).filename(), ".step-00000002.tmp");
  EXPECT_FALSE(fs::exists(dir_ / ".step-00000002.tmp"));
  EXPECT_TRUE(fs::exists(good));
  EXPECT_TRUE(manager.remove_stale_temps().empty());
}

TEST_F(CheckpointTest, EpochSampleOffsetRoundTrips) {
  CheckpointManager m(dir_.string(), CheckpointConfig{});
  TrainingState s;
  s.step = 9;
  s.epoch_sample_offset = 123;
  EXPECT_EQ(verify_checkpoint(m.save(*model_, *opt_, s, "")).epoch_sample_offset, 123);
}

TEST_F(CheckpointTest, LatestSkipsBrokenAndIncompleteCheckpoints) {
  save(1);
  const std::string second = save(2);
  fs::remove(fs::path(second) / "checkpoint.toml");     // as if the writer died before the manifest
  fs::create_directories(dir_ / ".step-00000003.tmp");  // an abandoned temp directory
  std::vector<std::string> skipped;
  auto latest = find_latest_checkpoint(dir_.string(), &skipped);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(fs::path(latest->path).filename(), "step-00000001");
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("step-00000002"), std::string::npos);
  EXPECT_FALSE(find_latest_checkpoint((dir_ / "nowhere").string(), nullptr).has_value());
}

TEST_F(CheckpointTest, OptimizerMismatchIsRefusedWithAHint) {
  const std::string path = save(3);
  AdamWOptions ao;
  auto adam = std::make_unique<AdamW>(model_->named_parameters(), ao);
  try {
    load_checkpoint(path, *model_, *adam);
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("HINT"), std::string::npos);
  }
}

// DistributedSampler semantics across a world-size change: what the old ranks consumed (a prefix of
// the epoch's global order) plus what the new ranks get after remap_world_size is every sample of the
// epoch exactly once, whatever the sizes, batch and drop_last (padding may repeat a sample only inside
// one sharding, as PyTorch's sampler does).
TEST(RemapWorldSize, OldRanksConsumedPlusNewRanksRemainingIsTheEpochOnce) {
  for (const bool drop_last : {false, true})
    for (const int64_t n : {100, 512})
      for (const int from : {2, 3})
        for (const int to : {1, 2, 3})
          for (const int64_t consumed_batches : {0, 1, 3, 7, 100}) {
            const int64_t batch = 7;
            TrainingState s;
            s.epoch = 4;
            s.world_size = from;
            s.batch_size = batch;
            s.batch_in_epoch = consumed_batches;
            std::multiset<int64_t> seen;
            std::vector<int64_t> order;
            for (int r = 0; r < from; ++r) {
              DistributedSampler old(n, from, r, true, 7, drop_last);
              old.set_epoch(s.epoch);
              order = old.permutation();
              const auto mine = old.indices();
              const size_t take = std::min<size_t>(mine.size(), consumed_batches * batch);
              seen.insert(mine.begin(), mine.begin() + static_cast<std::ptrdiff_t>(take));
            }
            const std::string line = remap_world_size(s, n, drop_last, to, 5, 1);
            EXPECT_EQ(s.world_size, to);
            EXPECT_EQ(s.batch_size, 5);
            EXPECT_EQ(s.batch_in_epoch, 0);
            EXPECT_NE(line.find("not bit-exact"), std::string::npos) << line;
            std::set<int64_t> old_set(seen.begin(), seen.end());
            // The consumed samples are the first epoch_sample_offset of the global order (less the tail
            // drop_last skipped when the old ranks finished the epoch).
            const std::set<int64_t> prefix(order.begin(), order.begin() + s.epoch_sample_offset);
            for (int64_t i : old_set) EXPECT_EQ(prefix.count(i), 1u) << i;
            EXPECT_LE(prefix.size() - old_set.size(), drop_last ? static_cast<size_t>(from - 1) : 0u)
                << n << " " << from << "->" << to << " after " << consumed_batches << " batches";
            std::set<int64_t> rest;
            for (int r = 0; r < to; ++r) {
              DistributedSampler next(n, to, r, true, 7, drop_last);
              next.set_epoch(s.epoch);
              for (int64_t i : next.indices_from(s.epoch_sample_offset)) {
                EXPECT_EQ(old_set.count(i), 0u) << "sample " << i << " seen twice";
                rest.insert(i);
              }
            }
            // Without drop_last every sample is seen; with it, at most to - 1 of the rest are dropped.
            const int64_t unseen = n - s.epoch_sample_offset;
            if (drop_last) {
              EXPECT_GE(static_cast<int64_t>(rest.size()), unseen - (to - 1));
            } else {
              EXPECT_EQ(static_cast<int64_t>(rest.size()), unseen);
            }
          }
}

// The step is the LR schedule's position: global samples seen over the new global batch.
TEST(RemapWorldSize, StepFollowsGlobalSamplesSeen) {
  TrainingState s;
  s.step = 11;
  s.epoch = 1;
  s.batch_in_epoch = 3;
  s.samples_seen = 11 * 64;
  s.world_size = 2;
  s.batch_size = 32;
  TrainingState same_global_batch = s;
  remap_world_size(same_global_batch, 512, false, 1, 64, 1);
  EXPECT_EQ(same_global_batch.step, 11);
  EXPECT_EQ(same_global_batch.epoch_sample_offset, 192);
  const std::string line = remap_world_size(s, 512, false, 3, 32, 2);
  EXPECT_EQ(s.step, 704 / 192);
  EXPECT_EQ(s.epoch_sample_offset, 192);
  EXPECT_NE(
      line.find("world size 2 -> 3: epoch 2 continues after 192 of its 512 samples; the 320 not yet seen"),
      std::string::npos)
      << line;
}

}  // namespace
}  // namespace trainer
