#include "data/device_prefetcher.h"

#include <stdexcept>
#include <string>
#include <utility>

#include "data/normalize.h"
#include "nn/runtime.h"

namespace trainer {

struct DevicePrefetcher::GpuState {
  struct InFlight {
    Batch batch;  // host tensors; the upload holds its own references until its copy completed
    runtime::Upload upload;
  };
  bool started = false;
  std::optional<InFlight> current;  // returned by next(), being consumed
  std::optional<InFlight> ahead;    // its upload queued behind current's
  // Declared last: destroyed first, so in-flight copies finish before the uploads let go of memory.
  runtime::CopyStream stream;

  std::optional<InFlight> load(DataLoader& loader) {
    std::optional<Batch> batch = loader.next();
    if (!batch) return std::nullopt;
    runtime::Upload upload = stream.upload({batch->images, batch->labels});
    return InFlight{std::move(*batch), std::move(upload)};
  }
};

BatchAllocator batch_allocator_for(Device device) {
  Allocator* pinned = device.is_cuda() ? runtime::pinned_host_allocator() : nullptr;
  if (!pinned) return {};
  return [pinned](const Shape& shape, DType dtype) { return Tensor::empty_from(*pinned, shape, dtype); };
}

DevicePrefetcher::DevicePrefetcher(DataLoader& loader, Device device, InputNormalization normalization)
    : loader_(loader), device_(device), normalization_(std::move(normalization)) {
  if (device_.is_cuda()) {
    if (!runtime::cuda_built())
      throw std::invalid_argument("DevicePrefetcher: this build has no CUDA backend");
    gpu_ = std::make_unique<GpuState>();
  }
}

DevicePrefetcher::~DevicePrefetcher() = default;

std::optional<Batch> DevicePrefetcher::next() {
  if (!gpu_) return loader_.next();
  GpuState& g = *gpu_;
  if (!g.started) {
    g.ahead = g.load(loader_);
    g.started = true;
  }
  // The batch returned last is done with; dropping its upload waits for its copy event, which
  // completed long ago (its compute has been queued behind it since).
  g.current = std::move(g.ahead);
  g.ahead.reset();
  if (!g.current) return std::nullopt;
  g.ahead = g.load(loader_);
  return g.current->batch;
}

DeviceBatch DevicePrefetcher::to_device(const Batch& batch) {
  if (!gpu_) {
    // Today's CPU path, kept exactly: tests compare its losses bit for bit across versions.
    return {to_float_normalized(batch.images, normalization_.mean, normalization_.std)
                .to(device_)
                .contiguous(normalization_.format),
            batch.labels.to(device_)};
  }
  GpuState& g = *gpu_;
  if (!g.current || g.current->batch.batch_index != batch.batch_index)
    throw std::logic_error("DevicePrefetcher::to_device: batch " + std::to_string(batch.batch_index) +
                           " is not the batch next() returned last");
  const std::vector<Tensor>& on_device = g.current->upload.device_tensors_for_compute();
  return {runtime::normalize_u8_nhwc(on_device[0], normalization_.mean, normalization_.std,
                                     normalization_.format),
          on_device[1]};
}

}  // namespace trainer
