#include "nn/cuda/copy_stream.h"

#include <utility>

#include "nn/cuda/cuda_common.h"

namespace trainer::cuda {
namespace {

cudaEvent_t as_event(void* e) { return static_cast<cudaEvent_t>(e); }
cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace

AsyncUpload::AsyncUpload(AsyncUpload&& other) noexcept
    : host_(std::move(other.host_)),
      device_(std::move(other.device_)),
      done_(std::exchange(other.done_, nullptr)) {}

AsyncUpload& AsyncUpload::operator=(AsyncUpload&& other) noexcept {
  if (this != &other) {
    release();
    host_ = std::move(other.host_);
    device_ = std::move(other.device_);
    done_ = std::exchange(other.done_, nullptr);
  }
  return *this;
}

AsyncUpload::~AsyncUpload() { release(); }

void AsyncUpload::release() {
  if (done_ != nullptr) {
    // Not CUDA_CHECK: destructors must not throw, and an error here is reported by the next call.
    (void)cudaEventSynchronize(as_event(done_));
    (void)cudaEventDestroy(as_event(done_));
    done_ = nullptr;
  }
  host_.clear();
  device_.clear();
}

const std::vector<Tensor>& AsyncUpload::device_tensors_for_compute() {
  if (done_ == nullptr) throw std::logic_error("AsyncUpload: no upload");
  CUDA_CHECK(cudaStreamWaitEvent(cuda_stream(), as_event(done_), 0));
  return device_;
}

bool AsyncUpload::complete() const {
  if (done_ == nullptr) return true;
  const cudaError_t status = cudaEventQuery(as_event(done_));
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not an error: clear it so that later checks do not report it
    return false;
  }
  CUDA_CHECK(status);
  return true;
}

void AsyncUpload::synchronize() {
  if (done_ != nullptr) CUDA_CHECK(cudaEventSynchronize(as_event(done_)));
  host_.clear();
}

CopyStream::CopyStream() {
  cuda_stream();  // makes the context's device current on this thread
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  stream_ = stream;
  cudaEvent_t ready = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  compute_ready_ = ready;
}

CopyStream::~CopyStream() {
  (void)cudaStreamSynchronize(as_stream(stream_));
  (void)cudaEventDestroy(as_event(compute_ready_));
  (void)cudaStreamDestroy(as_stream(stream_));
}

AsyncUpload CopyStream::upload(std::vector<Tensor> host) {
  for (const Tensor& t : host)
    if (!t.defined() || !t.device().is_cpu() || !t.is_contiguous())
      throw std::invalid_argument("CopyStream::upload: expected contiguous host tensors, got " +
                                  (t.defined() ? t.str() : std::string("an undefined tensor")));
  // Hazard (1) of the header: device blocks allocated below may still be in use by compute work.
  CUDA_CHECK(cudaEventRecord(as_event(compute_ready_), cuda_stream()));
  CUDA_CHECK(cudaStreamWaitEvent(as_stream(stream_), as_event(compute_ready_), 0));

  AsyncUpload upload;
  for (const Tensor& t : host) {
    Tensor d = empty(t.shape(), t.dtype());
    if (t.nbytes() > 0)
      CUDA_CHECK(cudaMemcpyAsync(d.raw_data(), t.raw_data(), t.nbytes(), cudaMemcpyHostToDevice,
                                 as_stream(stream_)));
    upload.device_.push_back(std::move(d));
  }
  cudaEvent_t done = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  upload.done_ = done;
  CUDA_CHECK(cudaEventRecord(done, as_stream(stream_)));
  upload.host_ = std::move(host);  // hazard (2): kept until the event has completed
  return upload;
}

}  // namespace trainer::cuda
