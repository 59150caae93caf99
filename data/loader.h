#pragma once
// Turns a dataset and one epoch's indices (from DistributedSampler or EvalShard) into uint8 batches,
// in order, optionally on worker threads that load ahead of the training loop.
//
// Batches are bit-identical for a given (seed, epoch) whatever the number of workers: each sample's
// augmentations (the dataset's own in Dataset::read_augmented, a random resized crop say, then those of
// LoaderOptions::transforms) draw from one Generator seeded by (seed, epoch, dataset index), never from
// a shared stream. Seeding by dataset index (not position) also makes a sample's augmentation independent of
// the world size and of resuming mid-epoch, so N ranks see exactly what one rank would.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <variant>
#include <vector>

#include "data/dataset.h"
#include "data/transforms.h"
#include "nn/tensor.h"

namespace trainer {

struct Batch {
  Tensor images;                 // u8 [B, H, W, C], contiguous
  Tensor labels;                 // i64 [B]
  std::vector<int64_t> indices;  // dataset indices of the B samples
  int64_t batch_index = 0;       // position in the epoch, counting from 0
  // Samples of this batch's slice of the indices that the dataset left out (kDroppedSample): B is
  // smaller by as many.
  int64_t dropped = 0;
};

// Makes the tensor a batch is assembled in: u8 [B, H, W, C] for the images, i64 [B] for the labels,
// contiguous and on the host. The hook for pinned (page-locked) host memory, which lets the copy to
// the GPU run asynchronously: the CUDA backend passes a factory that takes it from a pinned allocator.
using BatchAllocator = std::function<Tensor(const Shape& shape, DType dtype)>;

struct LoaderOptions {
  int64_t batch_size = 64;
  bool drop_last = false;  // skip a last partial batch
  TransformConfig transforms;
  uint64_t seed = 0;
  int64_t epoch = 0;
  int num_workers = 0;  // 0 loads each batch inside next(), on the calling thread
  // Most batches loaded or being loaded ahead of the consumer. Workers share a batch's samples, so a
  // few batches keep them all busy: the depth is never below what num_workers need for that
  // (workers x chunk / batch_size, plus one), and 0 means twice that plus two.
  int queue_depth = 0;
  int64_t first_batch = 0;        // resuming mid-epoch: start at this batch, skipping the ones before it
  BatchAllocator allocate_batch;  // empty = Tensor::empty on the host (pageable memory)
};

class DataLoader {
 public:
  // dataset is shared with the worker threads, so the loader holds a reference to it. Throws
  // std::invalid_argument on a non-positive batch size or negative worker count.
  DataLoader(std::shared_ptr<const Dataset> dataset, std::vector<int64_t> indices, LoaderOptions options);
  // Stops the workers and joins them, also mid-epoch: a worker finishes at most the sample it is on.
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // The next batch in order, or nullopt at the end of the epoch. Rethrows, here on the consumer's
  // thread, an exception a worker hit while loading this batch (a corrupt file, say); after that the
  // loader is finished and every call rethrows it. A batch whose samples the dataset all left out is
  // passed over, so a batch is never empty. Call from one thread at a time.
  std::optional<Batch> next();

  int64_t num_batches() const { return num_batches_; }  // in the whole epoch, including skipped ones
  const LoaderOptions& options() const { return options_; }
  // Samples the dataset left out (kDroppedSample) in the batches next() went through so far.
  int64_t dropped_samples() const { return dropped_samples_; }

 private:
  using Result = std::variant<Batch, std::exception_ptr>;

  // A batch that workers are loading. Workers share its samples: each claims the next few samples of
  // the oldest batch that still has unclaimed ones (a chunk), so all of them work on the batch the
  // consumer needs next before starting a later one. Batches therefore finish one after another at
  // the pool's full rate instead of num_workers at a time in bursts, and ahead-of-time loading
  // follows demand: when the consumer is faster, every worker serves the next batch; when it is
  // slower, finished batches pile up to queue_depth.
  struct InFlight {
    Batch batch;  // samples at their positions in the batch; compacted once all are loaded
    int64_t count = 0;
    int64_t claimed = 0;          // samples handed to workers
    int64_t done = 0;             // samples whose worker finished them
    std::vector<uint8_t> kept;    // per position: 0 where the dataset left the sample out
    int64_t error_position = -1;  // the failing sample nearest the batch's start
    std::exception_ptr error;     // its exception: which one surfaces does not depend on timing
  };
  struct Claim {
    InFlight* batch = nullptr;
    int64_t begin = 0, end = 0;  // sample positions in the batch
  };

  Tensor allocate(const Shape& shape, DType dtype) const;
  // The batch's indices and tensors, nothing loaded yet.
  Batch open_batch(int64_t batch_index) const;
  // Loads positions [begin, end) of `batch` into their slots; kept[i] says whether the dataset kept
  // sample i. Returns false when the loader is stopping.
  bool load_samples(Batch& batch, int64_t begin, int64_t end, std::vector<uint8_t>& kept,
                    std::vector<uint8_t>& scratch) const;
  // Moves the kept samples to the front and shortens the batch to them.
  void compact(Batch& batch, const std::vector<uint8_t>& kept) const;
  // Returns nullopt when the loader is stopping.
  std::optional<Batch> load_batch(int64_t batch_index, std::vector<uint8_t>& scratch) const;
  // Under mutex_: the next chunk a worker should load, opening a new batch when none has samples
  // left to claim and queue_depth allows. False when there is nothing to claim now.
  bool claim_locked(Claim& claim);
  void finish_claim(const Claim& claim, int64_t error_position, std::exception_ptr error);
  // next() without passing over empty batches.
  std::optional<Batch> next_loaded();
  void worker_loop();
  void stop_workers();

  std::shared_ptr<const Dataset> dataset_;
  std::vector<int64_t> indices_;
  LoaderOptions options_;
  ImageSize image_size_;
  int64_t num_batches_ = 0;
  int64_t queue_depth_ = 0;
  int64_t chunk_ = 1;  // samples a worker claims at once

  std::mutex mutex_;
  std::condition_variable slot_free_;      // workers wait for room ahead of the consumer
  std::condition_variable batch_ready_;    // the consumer waits for the next batch in order
  int64_t next_to_open_ = 0;               // the next batch workers start on
  int64_t next_to_yield_ = 0;              // the next batch next() returns
  std::map<int64_t, InFlight> in_flight_;  // opened, not all samples loaded (node addresses are stable)
  std::map<int64_t, Result> finished_;     // batches loaded (or failed) but not yet returned
  std::exception_ptr failure_;             // once set, next() rethrows it forever
  std::atomic<bool> stopping_{false};
  std::vector<std::uint8_t> scratch_;  // for loading without workers
  int64_t dropped_samples_ = 0;        // the consumer's count
  std::vector<std::thread> workers_;
};

}  // namespace trainer
