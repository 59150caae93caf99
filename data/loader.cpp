#include "data/loader.h"

#include <algorithm>
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
  next_to_claim_ = next_to_yield_ = std::min(options_.first_batch, num_batches_);
  const int64_t requested_depth = options_.queue_depth > 0 ? options_.queue_depth : 2 * options_.num_workers;
  queue_depth_ = std::max<int64_t>(requested_depth, options_.num_workers);
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

std::optional<Batch> DataLoader::load_batch(int64_t batch_index, std::vector<uint8_t>& scratch) const {
  const int64_t begin = batch_index * options_.batch_size;
  const int64_t count = std::min<int64_t>(options_.batch_size, static_cast<int64_t>(indices_.size()) - begin);
  const int64_t sample_bytes = image_size_.bytes();
  Batch batch;
  batch.batch_index = batch_index;
  batch.indices.assign(indices_.begin() + begin, indices_.begin() + begin + count);
  batch.images = allocate({count, image_size_.height, image_size_.width, image_size_.channels}, DType::u8);
  batch.labels = allocate({count}, DType::i64);
  uint8_t* images = batch.images.data<uint8_t>();
  int64_t* labels = batch.labels.data<int64_t>();
  int64_t kept = 0;  // samples are written at position `kept`: a dropped one is overwritten by the next
  for (int64_t i = 0; i < count; ++i) {
    if (stopping_.load(std::memory_order_relaxed)) return std::nullopt;
    const int64_t index = batch.indices[static_cast<size_t>(i)];
    uint8_t* image = images + kept * sample_bytes;
    Generator gen(
        mix_seed(options_.seed, static_cast<uint64_t>(options_.epoch), static_cast<uint64_t>(index)));
    const int64_t label = dataset_->read_augmented(index, image, gen);
    if (label == kDroppedSample) continue;
    if (options_.transforms.enabled())
      apply_transforms(options_.transforms, image, image_size_, gen, scratch);
    labels[kept] = label;
    batch.indices[static_cast<size_t>(kept)] = index;
    ++kept;
  }
  if (kept < count) {
    batch.dropped = count - kept;
    batch.indices.resize(static_cast<size_t>(kept));
    batch.images = batch.images.slice(0, 0, kept);  // a prefix of a contiguous tensor stays contiguous
    batch.labels = batch.labels.slice(0, 0, kept);
  }
  return batch;
}

void DataLoader::worker_loop() {
  std::vector<uint8_t> scratch;
  while (true) {
    int64_t batch_index;
    {
      std::unique_lock lock(mutex_);
      slot_free_.wait(lock, [&] {
        return stopping_ || next_to_claim_ >= num_batches_ || next_to_claim_ - next_to_yield_ < queue_depth_;
      });
      if (stopping_ || next_to_claim_ >= num_batches_) return;
      batch_index = next_to_claim_++;
    }
    Result result;
    try {
      std::optional<Batch> batch = load_batch(batch_index, scratch);
      if (!batch) return;  // stopping
      result = std::move(*batch);
    } catch (...) {
      result = std::current_exception();
    }
    {
      std::lock_guard lock(mutex_);
      finished_.emplace(batch_index, std::move(result));
    }
    batch_ready_.notify_one();
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
