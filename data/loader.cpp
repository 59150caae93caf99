#include "data/loader.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "data/distributed_sampler.h"
#include "data/hash.h"
#include "nn/random.h"

namespace trainer {

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, std::vector<int64_t> indices,
                       LoaderOptions options)
    : dataset_(std::move(dataset)), indices_(std::move(indices)), options_(options) {
  if (!dataset_) throw std::invalid_argument("DataLoader: no dataset");
  if (options_.batch_size < 1 || options_.num_workers < 0 || options_.queue_depth < 0 ||
      options_.first_batch < 0) {
    throw std::invalid_argument(
        "DataLoader: need batch_size >= 1 and num_workers, queue_depth, first_batch >= 0; got " +
        std::to_string(options_.batch_size) + ", " + std::to_string(options_.num_workers) + ", " +
        std::to_string(options_.queue_depth) + ", " + std::to_string(options_.first_batch));
  }
  image_size_ = {dataset_->height(), dataset_->width(), dataset_->channels()};
  num_batches_ =
      steps_per_epoch(static_cast<int64_t>(indices_.size()), options_.batch_size, options_.drop_last);
  next_to_open_ = next_to_yield_ = std::min(options_.first_batch, num_batches_);
  // A chunk is a quarter of a batch's share per worker: small enough that every worker gets a part of
  // each batch, large enough that claiming (one lock) costs nothing next to loading the samples.
  const int64_t workers = std::max(options_.num_workers, 1);
  chunk_ = std::max<int64_t>(1, options_.batch_size / (4 * workers));
  const int64_t busy_depth = (workers * chunk_ + options_.batch_size - 1) / options_.batch_size + 1;
  const int64_t requested_depth = options_.queue_depth > 0 ? options_.queue_depth : 2 * busy_depth + 2;
  queue_depth_ = std::max(requested_depth, busy_depth);
  workers_.reserve(static_cast<size_t>(options_.num_workers));
  try {
    for (int w = 0; w < options_.num_workers; ++w) workers_.emplace_back([this] { worker_loop(); });
  } catch (...) {
    stop_workers();  // the destructor does not run for a half-built object
    throw;
  }
}

DataLoader::~DataLoader() { stop_workers(); }

void DataLoader::stop_workers() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  slot_free_.notify_all();
  for (std::thread& worker : workers_) worker.join();
  workers_.clear();
}

Tensor DataLoader::allocate(const Shape& shape, DType dtype) const {
  if (!options_.allocate_batch) return Tensor::empty(shape, dtype);
  Tensor tensor = options_.allocate_batch(shape, dtype);
  if (!tensor.defined() || tensor.shape() != shape || tensor.dtype() != dtype || !tensor.is_contiguous() ||
      !tensor.device().is_cpu()) {
    throw std::logic_error("DataLoader: allocate_batch must return a contiguous host tensor of shape " +
                           shape_str(shape) + ", got " + (tensor.defined() ? tensor.str() : "none"));
  }
  return tensor;
}

Batch DataLoader::open_batch(int64_t batch_index) const {
  const int64_t begin = batch_index * options_.batch_size;
  const int64_t count = std::min<int64_t>(options_.batch_size, static_cast<int64_t>(indices_.size()) - begin);
  Batch batch;
  batch.batch_index = batch_index;
  batch.indices.assign(indices_.begin() + begin, indices_.begin() + begin + count);
  batch.images = allocate({count, image_size_.height, image_size_.width, image_size_.channels}, DType::u8);
  batch.labels = allocate({count}, DType::i64);
  return batch;
}

bool DataLoader::load_samples(Batch& batch, int64_t begin, int64_t end, std::vector<uint8_t>& kept,
                              std::vector<uint8_t>& scratch) const {
  const int64_t sample_bytes = image_size_.bytes();
  uint8_t* images = batch.images.data<uint8_t>();
  int64_t* labels = batch.labels.data<int64_t>();
  for (int64_t i = begin; i < end; ++i) {
    if (stopping_.load(std::memory_order_relaxed)) return false;
    const int64_t index = batch.indices[static_cast<size_t>(i)];
    uint8_t* image = images + i * sample_bytes;
    Generator gen(
        mix_seed(options_.seed, static_cast<uint64_t>(options_.epoch), static_cast<uint64_t>(index)));
    const int64_t label = dataset_->read_augmented(index, image, gen);
    kept[static_cast<size_t>(i)] = label != kDroppedSample;
    if (label == kDroppedSample) continue;
    if (options_.transforms.enabled())
      apply_transforms(options_.transforms, image, image_size_, gen, scratch);
    labels[i] = label;
  }
  return true;
}

void DataLoader::compact(Batch& batch, const std::vector<uint8_t>& kept) const {
  const int64_t count = static_cast<int64_t>(kept.size());
  const int64_t sample_bytes = image_size_.bytes();
  uint8_t* images = batch.images.data<uint8_t>();
  int64_t* labels = batch.labels.data<int64_t>();
  int64_t at = 0;
  for (int64_t i = 0; i < count; ++i) {
    if (!kept[static_cast<size_t>(i)]) continue;
    if (at != i) {
      std::memcpy(images + at * sample_bytes, images + i * sample_bytes, static_cast<size_t>(sample_bytes));
      labels[at] = labels[i];
      batch.indices[static_cast<size_t>(at)] = batch.indices[static_cast<size_t>(i)];
    }
    ++at;
  }
  if (at < count) {
    batch.dropped = count - at;
    batch.indices.resize(static_cast<size_t>(at));
    batch.images = batch.images.slice(0, 0, at);  // a prefix of a contiguous tensor stays contiguous
    batch.labels = batch.labels.slice(0, 0, at);
  }
}

std::optional<Batch> DataLoader::load_batch(int64_t batch_index, std::vector<uint8_t>& scratch) const {
  Batch batch = open_batch(batch_index);
  std::vector<uint8_t> kept(batch.indices.size(), 0);
  if (!load_samples(batch, 0, static_cast<int64_t>(kept.size()), kept, scratch)) return std::nullopt;
  compact(batch, kept);
  return batch;
}

bool DataLoader::claim_locked(Claim& claim) {
  InFlight* open = nullptr;
  for (auto& [index, batch] : in_flight_) {
    if (batch.claimed < batch.count) {
      open = &batch;
      break;
    }
  }
  while (!open) {
    if (next_to_open_ >= num_batches_ || next_to_open_ - next_to_yield_ >= queue_depth_) return false;
    const int64_t index = next_to_open_++;
    Batch batch;
    try {
      batch = open_batch(index);
    } catch (...) {  // the allocation hook failed: the batch's result is that error
      finished_.emplace(index, std::current_exception());
      batch_ready_.notify_one();
      continue;
    }
    InFlight& opened = in_flight_[index];
    opened.count = static_cast<int64_t>(batch.indices.size());
    opened.kept.assign(static_cast<size_t>(opened.count), 0);
    opened.batch = std::move(batch);
    open = &opened;
    slot_free_.notify_all();  // idle workers can share the new batch
  }
  claim.batch = open;
  claim.begin = open->claimed;
  claim.end = std::min(open->count, open->claimed + chunk_);
  open->claimed = claim.end;
  return true;
}

void DataLoader::finish_claim(const Claim& claim, int64_t error_position, std::exception_ptr error) {
  InFlight* batch = claim.batch;
  std::unique_lock lock(mutex_);
  if (error && (batch->error_position < 0 || error_position < batch->error_position)) {
    batch->error_position = error_position;
    batch->error = error;
  }
  batch->done += claim.end - claim.begin;
  if (batch->done < batch->count) return;
  // The last chunk: no other worker touches this batch any more.
  InFlight finished = std::move(in_flight_.extract(batch->batch.batch_index).mapped());
  lock.unlock();
  Result result;
  if (finished.error) {
    result = finished.error;
  } else {
    compact(finished.batch, finished.kept);
    result = std::move(finished.batch);
  }
  lock.lock();
  finished_.emplace(finished.batch.batch_index, std::move(result));
  lock.unlock();
  batch_ready_.notify_one();
}

void DataLoader::worker_loop() {
  std::vector<uint8_t> scratch;
  while (true) {
    Claim claim;
    {
      std::unique_lock lock(mutex_);
      while (!stopping_ && !claim_locked(claim)) {
        if (next_to_open_ >= num_batches_) return;  // every sample is claimed: nothing left to do
        slot_free_.wait(lock);
      }
      if (stopping_) return;
    }
    int64_t error_position = -1;
    std::exception_ptr error;
    bool stopped = false;
    // Position by position, so that a failing sample is known by its place in the batch.
    for (int64_t i = claim.begin; i < claim.end && !stopped && !error; ++i) {
      try {
        stopped = !load_samples(claim.batch->batch, i, i + 1, claim.batch->kept, scratch);
      } catch (...) {
        error_position = i;
        error = std::current_exception();
      }
    }
    if (stopped) return;
    finish_claim(claim, error_position, error);
  }
}

std::optional<Batch> DataLoader::next() {
  while (std::optional<Batch> batch = next_loaded()) {
    dropped_samples_ += batch->dropped;
    if (!batch->indices.empty()) return batch;
  }
  return std::nullopt;
}

std::optional<Batch> DataLoader::next_loaded() {
  if (failure_) std::rethrow_exception(failure_);
  if (next_to_yield_ >= num_batches_) return std::nullopt;

  if (workers_.empty()) {
    try {
      return load_batch(next_to_yield_++, scratch_);
    } catch (...) {
      failure_ = std::current_exception();
      throw;
    }
  }

  Result result;
  {
    std::unique_lock lock(mutex_);
    batch_ready_.wait(lock, [&] { return finished_.count(next_to_yield_) > 0; });
    auto found = finished_.find(next_to_yield_);
    result = std::move(found->second);
    finished_.erase(found);
    ++next_to_yield_;
    if (std::holds_alternative<std::exception_ptr>(result)) {
      failure_ = std::get<std::exception_ptr>(result);
      stopping_ = true;  // the epoch cannot continue: let the workers go
    }
  }
  slot_free_.notify_all();
  if (failure_) std::rethrow_exception(failure_);
  return std::get<Batch>(std::move(result));
}

}  // namespace trainer
