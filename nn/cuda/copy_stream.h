#pragma once
// Host -> device copies on a stream of their own, so that the next batch's upload overlaps with the
// current batch's kernels on the compute stream. Ordering is by events, never by host waits:
//
//   compute stream  ... step k-1 ... | step k (waits for upload k's event) ...............
//   copy stream                  (waits for what compute had queued) upload k+1 -> event
//
// Two hazards are handled here. (1) The caching allocator recycles device blocks in compute-stream
// order, so a block handed to an upload may still be read by compute work queued earlier: the copy
// stream first waits for an event recorded on the compute stream when the upload is queued.
// (2) The host tensors (pinned, and recycled by their cache as soon as they are freed) must not be
// reused by a loader worker while the DMA still reads them: an AsyncUpload owns them until its copy
// event has completed.
//
// Plain C++ (no CUDA headers: streams and events are held as void*), so data/ can include it.
#include <vector>

#include "nn/tensor.h"

namespace trainer::cuda {

class AsyncUpload {
 public:
  AsyncUpload() = default;
  AsyncUpload(AsyncUpload&& other) noexcept;
  AsyncUpload& operator=(AsyncUpload&& other) noexcept;
  AsyncUpload(const AsyncUpload&) = delete;
  AsyncUpload& operator=(const AsyncUpload&) = delete;
  // Waits for the copy (normally long complete), then releases host and device tensors: a device
  // block must not go back to the allocator while the copy stream may still write it.
  ~AsyncUpload();

  bool defined() const { return done_ != nullptr; }
  // Makes the compute stream wait for the copy (the host does not wait) and returns the device
  // tensors, in the order given to CopyStream::upload. Use them only on the compute stream.
  const std::vector<Tensor>& device_tensors_for_compute();
  // Whether the copy has completed, so the host tensors could be reused.
  bool complete() const;
  // Blocks until the copy has completed, then drops the host tensors.
  void synchronize();
  // The host tensors this upload keeps alive (empty once synchronised).
  const std::vector<Tensor>& host_tensors() const { return host_; }

 private:
  friend class CopyStream;
  void release();

  std::vector<Tensor> host_;
  std::vector<Tensor> device_;
  void* done_ = nullptr;  // cudaEvent_t recorded on the copy stream after the copies
};

class CopyStream {
 public:
  // A non-blocking stream (it does not synchronise with the legacy default stream) on the GPU of
  // this process; init_cuda_backend must have run.
  CopyStream();
  ~CopyStream();  // waits for the copies queued on it
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;

  // Queues a copy of each host tensor (contiguous, on the CPU; pinned for the copy to be truly
  // asynchronous) into a new device tensor of the same shape and dtype, and returns at once.
  // Throws std::invalid_argument for a tensor that is not a contiguous host tensor.
  AsyncUpload upload(std::vector<Tensor> host);

  void* stream() const { return stream_; }  // cudaStream_t

 private:
  void* stream_ = nullptr;         // cudaStream_t
  void* compute_ready_ = nullptr;  // cudaEvent_t, re-recorded on the compute stream per upload
};

}  // namespace trainer::cuda
