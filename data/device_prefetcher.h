#pragma once
// Feeds the model from a DataLoader on the training device. On the CPU it is the plain path
// (to_float_normalized on the host, data/normalize.h), so CPU runs are unchanged bit for bit. On a
// GPU it keeps one batch in flight:
//
//   next() returns batch k, whose u8 upload was queued on the copy stream one call earlier, and
//          queues batch k+1's upload (it then runs while the compute stream works on batch k);
//   to_device(batch k) makes the compute stream wait for k's copy event and normalises there
//          (nn/runtime.h's normalize_u8_nhwc): u8 crosses the bus, a quarter of the bytes of f32.
//
// The loader's batches should then sit in pinned memory (batch_allocator_for), so that the copies are
// DMA transfers that overlap with kernels. Batches equal the CPU path's bit for bit.
#include <memory>
#include <optional>
#include <vector>

#include "data/loader.h"
#include "nn/tensor.h"

namespace trainer {

// How the loader should allocate batches for `device`: pinned host memory for a GPU, the default
// (empty function: pageable memory) for the CPU.
BatchAllocator batch_allocator_for(Device device);

struct DeviceBatch {
  Tensor images;  // f32 [B, C, H, W] on the device, in the requested memory format
  Tensor labels;  // i64 [B] on the device
};

struct InputNormalization {
  std::vector<float> mean;  // C values, or one for all channels
  std::vector<float> std;
  MemoryFormat format = MemoryFormat::contiguous;  // of DeviceBatch::images
};

class DevicePrefetcher {
 public:
  // loader must outlive the prefetcher. With a CUDA device, runtime::init_device must have run.
  DevicePrefetcher(DataLoader& loader, Device device, InputNormalization normalization);
  ~DevicePrefetcher();
  DevicePrefetcher(const DevicePrefetcher&) = delete;
  DevicePrefetcher& operator=(const DevicePrefetcher&) = delete;

  // The loader's next batch (host tensors), or nullopt at the end of the epoch; rethrows the loader's
  // errors. On a GPU this also queues the upload of the batch after it.
  std::optional<Batch> next();
  // The model's input for `batch`, the batch next() returned last. On a GPU the result is ready in
  // compute-stream order (the host does not wait for the copy). Throws std::logic_error for another batch.
  DeviceBatch to_device(const Batch& batch);

  Device device() const { return device_; }

 private:
  struct GpuState;  // the copy stream and the uploads in flight (on a GPU only)

  DataLoader& loader_;
  Device device_;
  InputNormalization normalization_;
  std::unique_ptr<GpuState> gpu_;
};

}  // namespace trainer
