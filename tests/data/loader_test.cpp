#include "data/loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "data/data_error.h"
#include "data/distributed_sampler.h"
#include "data/hash.h"
#include "data/synthetic.h"
#include "nn/random.h"

namespace trainer {
namespace {

std::shared_ptr<const Dataset> synthetic(int64_t size) {
  return std::make_shared<SyntheticDataset>(SyntheticConfig{size, 3, 8, 8, 10, 3});
}

std::vector<Batch> drain(DataLoader& loader) {
  std::vector<Batch> batches;
  while (std::optional<Batch> batch = loader.next()) batches.push_back(std::move(*batch));
  return batches;
}

// A dataset whose reads are slow, or fail at one index, to exercise the threads.
class TroubledDataset : public SyntheticDataset {
 public:
  TroubledDataset(int64_t size, std::chrono::microseconds read_delay, int64_t failing_index = -1)
      : SyntheticDataset({size, 1, 4, 4, 10, 0}), read_delay_(read_delay), failing_index_(failing_index) {}
  void read_into(int64_t index, uint8_t* hwc_out) const override {
    if (index == failing_index_) throw DataError("/data/broken.gz: corrupt gzip stream: invalid block type");
    std::this_thread::sleep_for(read_delay_);
    SyntheticDataset::read_into(index, hwc_out);
  }

 private:
  std::chrono::microseconds read_delay_;
  int64_t failing_index_;
};

// A dataset that leaves out (kDroppedSample) the indices divisible by 3, as an evaluation split with
// bad_samples = "skip" leaves out its unreadable images.
class LeavingOutDataset : public SyntheticDataset {
 public:
  explicit LeavingOutDataset(int64_t size) : SyntheticDataset({size, 1, 4, 4, 10, 0}) {}
  int64_t read_augmented(int64_t index, uint8_t* hwc_out, Generator& gen) const override {
    if (index % 3 == 0) {
      std::memset(hwc_out, 0xee, static_cast<size_t>(sample_bytes()));  // must not reach a batch
      return kDroppedSample;
    }
    return SyntheticDataset::read_augmented(index, hwc_out, gen);
  }
};

TEST(DataLoader, SamplesTheDatasetLeavesOutAreDroppedFromTheirBatchAndCounted) {
  const auto dataset = std::make_shared<LeavingOutDataset>(20);
  // Batches of 3: {0, 3, 6} is all left out and passed over, the others lose one sample each.
  const std::vector<int64_t> indices = {1, 0, 2, 0, 3, 6, 4, 5, 9, 7, 8, 18};
  for (const int workers : {0, 3}) {
    LoaderOptions options;
    options.batch_size = 3;
    options.num_workers = workers;
    DataLoader loader(dataset, indices, options);
    const std::vector<Batch> batches = drain(loader);
    ASSERT_EQ(batches.size(), 3u) << workers;
    EXPECT_EQ(batches[0].indices, (std::vector<int64_t>{1, 2}));
    EXPECT_EQ(batches[1].indices, (std::vector<int64_t>{4, 5}));
    EXPECT_EQ(batches[2].indices, (std::vector<int64_t>{7, 8}));
    EXPECT_EQ(batches[1].batch_index, 2);  // its position in the epoch, counting the one passed over
    EXPECT_EQ(batches[0].dropped, 1);
    for (const Batch& batch : batches) {
      ASSERT_EQ(batch.images.shape(), (Shape{2, 4, 4, 1}));
      ASSERT_TRUE(batch.images.is_contiguous());
      const std::vector<uint8_t> pixels = batch.images.to_vector<uint8_t>();
      const std::vector<int64_t> labels = batch.labels.to_vector<int64_t>();
      for (size_t i = 0; i < 2; ++i) {
        const Sample expected = dataset->get(batch.indices[i]);
        EXPECT_EQ(labels[i], expected.label);
        EXPECT_TRUE(std::equal(expected.pixels.begin(), expected.pixels.end(), pixels.begin() + 16 * i));
      }
    }
    EXPECT_EQ(loader.dropped_samples(), 6) << workers;
  }
}

TEST(DataLoader, BatchesAreIdenticalWhateverTheWorkerCount) {
  const auto dataset = synthetic(203);
  DistributedSampler sampler(203, 2, 1, true, 17, false);
  sampler.set_epoch(3);
  LoaderOptions options;
  options.batch_size = 16;
  options.transforms.crop_padding = 4;
  options.transforms.horizontal_flip = true;
  options.seed = 17;
  options.epoch = 3;

  std::vector<std::vector<Batch>> runs;
  for (const int workers : {0, 1, 4}) {
    options.num_workers = workers;
    options.queue_depth = workers == 4 ? 1 : 0;  // a depth below the worker count must still work
    DataLoader loader(dataset, sampler.indices(), options);
    runs.push_back(drain(loader));
  }
  ASSERT_EQ(runs[0].size(), 7u);  // 102 samples in batches of 16
  for (size_t run = 1; run < runs.size(); ++run) {
    ASSERT_EQ(runs[run].size(), runs[0].size());
    for (size_t b = 0; b < runs[0].size(); ++b) {
      EXPECT_EQ(runs[run][b].batch_index, static_cast<int64_t>(b));
      EXPECT_EQ(runs[run][b].indices, runs[0][b].indices);
      EXPECT_EQ(runs[run][b].images.to_vector<uint8_t>(), runs[0][b].images.to_vector<uint8_t>());
      EXPECT_EQ(runs[run][b].labels.to_vector<int64_t>(), runs[0][b].labels.to_vector<int64_t>());
    }
  }
}

TEST(DataLoader, BatchesHoldTheSamplesInOrder) {
  const auto dataset = synthetic(10);
  const std::vector<int64_t> indices = {9, 2, 2, 5, 0, 7, 1};
  for (const bool drop_last : {false, true}) {
    LoaderOptions options;
    options.batch_size = 3;
    options.drop_last = drop_last;
    options.num_workers = 2;
    DataLoader loader(dataset, indices, options);
    EXPECT_EQ(loader.num_batches(), drop_last ? 2 : 3);
    const std::vector<Batch> batches = drain(loader);
    ASSERT_EQ(batches.size(), drop_last ? 2u : 3u);
    EXPECT_EQ(batches[0].images.shape(), (Shape{3, 8, 8, 3}));
    EXPECT_TRUE(batches[0].images.is_contiguous());
    EXPECT_EQ(batches[0].labels.dtype(), DType::i64);
    if (!drop_last) {
      EXPECT_EQ(batches[2].indices, std::vector<int64_t>{1});
    }
    for (const Batch& batch : batches) {
      const std::vector<uint8_t> pixels = batch.images.to_vector<uint8_t>();
      const std::vector<int64_t> labels = batch.labels.to_vector<int64_t>();
      for (size_t i = 0; i < batch.indices.size(); ++i) {
        const Sample sample = dataset->get(batch.indices[i]);  // no transforms: the raw sample
        EXPECT_EQ(labels[i], sample.label);
        EXPECT_EQ(0, std::memcmp(pixels.data() + i * sample.pixels.size(), sample.pixels.data(),
                                 sample.pixels.size()));
      }
    }
  }
}

TEST(DataLoader, ResumingMidEpochGivesTheSameRemainingBatches) {
  const auto dataset = synthetic(50);
  LoaderOptions options;
  options.batch_size = 8;
  options.transforms.crop_padding = 2;
  options.transforms.horizontal_flip = true;
  options.seed = 1;
  std::vector<int64_t> indices(50);
  for (int64_t i = 0; i < 50; ++i) indices[static_cast<size_t>(i)] = (i * 7) % 50;
  DataLoader full(dataset, indices, options);
  const std::vector<Batch> all = drain(full);
  options.first_batch = 4;
  options.num_workers = 2;
  DataLoader resumed(dataset, indices, options);
  const std::vector<Batch> rest = drain(resumed);
  ASSERT_EQ(rest.size(), all.size() - 4);
  for (size_t b = 0; b < rest.size(); ++b) {
    EXPECT_EQ(rest[b].batch_index, all[b + 4].batch_index);
    EXPECT_EQ(rest[b].images.to_vector<uint8_t>(), all[b + 4].images.to_vector<uint8_t>());
  }
}

TEST(DataLoader, AugmentationChangesWithTheEpoch) {
  const auto dataset = synthetic(8);
  LoaderOptions options;
  options.batch_size = 8;
  options.transforms.crop_padding = 4;
  options.transforms.horizontal_flip = true;
  const std::vector<int64_t> indices = {0, 1, 2, 3, 4, 5, 6, 7};
  DataLoader epoch0(dataset, indices, options);
  options.epoch = 1;
  DataLoader epoch1(dataset, indices, options);
  EXPECT_NE(epoch0.next()->images.to_vector<uint8_t>(), epoch1.next()->images.to_vector<uint8_t>());
}

TEST(DataLoader, DestroyingMidEpochReturnsPromptly) {
  // 100000 samples at 200 us each take 20 s or more: stopping must not wait for them.
  const auto dataset = std::make_shared<TroubledDataset>(100000, std::chrono::microseconds(200));
  std::vector<int64_t> indices(100000);
  for (int64_t i = 0; i < 100000; ++i) indices[static_cast<size_t>(i)] = i;
  for (const bool consume_one : {true, false}) {
    LoaderOptions options;
    options.batch_size = 2000;
    options.num_workers = 4;
    options.queue_depth = 8;
    const auto start = std::chrono::steady_clock::now();
    {
      DataLoader loader(dataset, indices, options);
      if (consume_one) {
        ASSERT_TRUE(loader.next().has_value());
      }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // A batch is about 0.5 s of reads; stopping itself costs at most one sample per worker.
    EXPECT_LT(seconds, consume_one ? 3.0 : 1.0);
  }
}

TEST(DataLoader, WorkerExceptionSurfacesInNextAfterTheBatchesBeforeIt) {
  const auto dataset = std::make_shared<TroubledDataset>(40, std::chrono::microseconds(0), 25);
  std::vector<int64_t> indices(40);
  for (int64_t i = 0; i < 40; ++i) indices[static_cast<size_t>(i)] = i;
  for (const int workers : {0, 1, 4}) {
    LoaderOptions options;
    options.batch_size = 10;
    options.num_workers = workers;
    DataLoader loader(dataset, indices, options);
    ASSERT_TRUE(loader.next().has_value());
    ASSERT_TRUE(loader.next().has_value());
    for (int attempt = 0; attempt < 2; ++attempt) {  // the loader stays failed
      try {
        loader.next();
        ADD_FAILURE() << "expected the worker's DataError, workers " << workers;
      } catch (const DataError& error) {
        EXPECT_STREQ(error.what(), "/data/broken.gz: corrupt gzip stream: invalid block type");
      }
    }
  }
}

// Records which thread read each index; index `slow` takes longer and fails, as does `fast` (after it
// in the batch, but first in time).
class ThreadRecordingDataset : public SyntheticDataset {
 public:
  ThreadRecordingDataset(int64_t size, int64_t slow_failure, int64_t fast_failure)
      : SyntheticDataset({size, 1, 4, 4, 10, 0}), slow_(slow_failure), fast_(fast_failure) {}
  void read_into(int64_t index, uint8_t* hwc_out) const override {
    {
      std::lock_guard lock(mutex_);
      readers_.insert(std::this_thread::get_id());
    }
    if (index == slow_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      throw DataError("/data/first.jpg: broken");
    }
    if (index == fast_) throw DataError("/data/second.jpg: broken");
    std::this_thread::sleep_for(std::chrono::microseconds(500));
    SyntheticDataset::read_into(index, hwc_out);
  }
  size_t readers() const {
    std::lock_guard lock(mutex_);
    return readers_.size();
  }

 private:
  int64_t slow_, fast_;
  mutable std::mutex mutex_;
  mutable std::set<std::thread::id> readers_;
};

TEST(DataLoader, WorkersShareTheSamplesOfTheNextBatch) {
  // One batch of 64 samples at 0.5 ms each: with whole batches per worker, one thread would read all
  // of it; shared, every worker takes part.
  const auto dataset = std::make_shared<ThreadRecordingDataset>(64, -1, -1);
  std::vector<int64_t> indices(64);
  for (int64_t i = 0; i < 64; ++i) indices[static_cast<size_t>(i)] = i;
  LoaderOptions options;
  options.batch_size = 64;
  options.num_workers = 4;
  DataLoader loader(dataset, indices, options);
  ASSERT_TRUE(loader.next().has_value());
  EXPECT_GT(dataset->readers(), 1u);
  EXPECT_FALSE(loader.next().has_value());
}

TEST(DataLoader, TheFirstFailingSampleInTheBatchIsReportedWhateverFailsFirst) {
  // Index 3 fails after 50 ms, index 40 at once: the error is index 3's, as without workers.
  const auto dataset = std::make_shared<ThreadRecordingDataset>(64, 3, 40);
  std::vector<int64_t> indices(64);
  for (int64_t i = 0; i < 64; ++i) indices[static_cast<size_t>(i)] = i;
  for (const int workers : {0, 4}) {
    LoaderOptions options;
    options.batch_size = 64;
    options.num_workers = workers;
    DataLoader loader(dataset, indices, options);
    try {
      loader.next();
      ADD_FAILURE() << "expected a DataError, workers " << workers;
    } catch (const DataError& error) {
      EXPECT_STREQ(error.what(), "/data/first.jpg: broken") << workers;
    }
  }
}

TEST(DataLoader, RejectsBadOptions) {
  LoaderOptions options;
  options.batch_size = 0;
  EXPECT_THROW(DataLoader(synthetic(4), {0, 1}, options), std::invalid_argument);
  options.batch_size = 1;
  options.num_workers = -1;
  EXPECT_THROW(DataLoader(synthetic(4), {0, 1}, options), std::invalid_argument);
}

TEST(DataLoader, BatchesAreAllocatedThroughTheHook) {
  int calls = 0;
  LoaderOptions options;
  options.batch_size = 4;
  options.num_workers = 2;
  options.allocate_batch = [&calls](const Shape& shape, DType dtype) {
    ++calls;  // a pinned-memory allocator would go here
    return Tensor::empty(shape, dtype);
  };
  DataLoader loader(synthetic(8), {0, 1, 2, 3, 4, 5, 6, 7}, options);
  while (loader.next()) {
  }
  EXPECT_EQ(calls, 4);  // images and labels of 2 batches

  options.allocate_batch = [](const Shape& shape, DType dtype) { return Tensor::empty({1}, dtype); };
  DataLoader wrong(synthetic(8), {0, 1, 2, 3}, options);
  EXPECT_THROW(wrong.next(), std::logic_error);
}

// A dataset that augments itself and reports another label for some samples, as a dataset replacing
// unreadable files does: the loader must take both from read_augmented.
class SelfAugmentingDataset : public SyntheticDataset {
 public:
  SelfAugmentingDataset() : SyntheticDataset({10, 1, 2, 2, 10, 0}) {}
  int64_t read_augmented(int64_t index, uint8_t* hwc_out, Generator& gen) const override {
    const uint8_t value = static_cast<uint8_t>(gen.below(256));
    std::memset(hwc_out, value, 4);
    return 100 + index;
  }
};

TEST(DataLoader, SamplesComeFromReadAugmentedWithTheSampleGenerator) {
  LoaderOptions options;
  options.batch_size = 3;
  options.seed = 5;
  options.epoch = 2;
  DataLoader loader(std::make_shared<SelfAugmentingDataset>(), {7, 3, 7}, options);
  const Batch batch = *loader.next();
  EXPECT_EQ(batch.labels.to_vector<int64_t>(), (std::vector<int64_t>{107, 103, 107}));
  const std::vector<uint8_t> pixels = batch.images.to_vector<uint8_t>();
  Generator expected(mix_seed(5, 2, 7));
  EXPECT_EQ(pixels[0], expected.below(256));
  EXPECT_EQ(pixels[0], pixels[8]);  // the same index, the same draw
}

TEST(DataLoader, EmptyEpochYieldsNothing) {
  LoaderOptions options;
  options.num_workers = 2;
  DataLoader loader(synthetic(4), {}, options);
  EXPECT_EQ(loader.num_batches(), 0);
  EXPECT_FALSE(loader.next().has_value());
}

}  // namespace
}  // namespace trainer
