// nn/runtime.h on the CUDA backend: each call is today's CUDA call, behind the device-neutral names.
// The GPU's identity and versions are in runtime_cuda_identity.cpp.
#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "nn/cuda/caching_allocator.h"
#include "nn/cuda/conv_stats_fusion.h"
#include "nn/cuda/copy_stream.h"
#include "nn/cuda/cuda_backend.h"
#include "nn/cuda/cuda_graph.h"
#include "nn/cuda/cudnn_batch_norm.h"
#include "nn/cuda/normalize_input.h"
#include "nn/cuda/pinned_allocator.h"
#include "nn/runtime.h"

namespace trainer::runtime {
namespace {

cudaStream_t as_cuda(Stream s) { return static_cast<cudaStream_t>(s.handle()); }

// Until `event` has completed: in the driver without a poll; else polling, calling `failed` between
// polls, with naps growing to 50 us so the host resumes promptly when the event completes.
void wait_for(cudaEvent_t event, const FailurePoll& failed) {
  if (!failed) {
    CUDA_CHECK(cudaEventSynchronize(event));
    return;
  }
  auto nap = std::chrono::microseconds(2);
  for (;;) {
    const cudaError_t q = cudaEventQuery(event);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) CUDA_CHECK(q);
    failed();
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(50));
  }
}

}  // namespace

bool cuda_built() { return true; }
int device_count() { return cuda_device_count(); }
void init_device(int index) { init_cuda_backend(index); }
void synchronize() { cuda_synchronize(); }

void apply_backend_options(const BackendOptions& options) { cuda_set_options(options); }
const BackendOptions& backend_options() { return cuda_options(); }

Stream compute_stream() { return Stream(cuda_stream()); }

// ---- Event

struct Event::Impl {
  bool timing = false;
  cudaEvent_t event = nullptr;  // created at the first record()
  ~Impl() {
    if (event) cudaEventDestroy(event);
  }
};

Event::Event(bool timing) : impl_(std::make_unique<Impl>()) { impl_->timing = timing; }
Event::~Event() = default;
Event::Event(Event&&) noexcept = default;
Event& Event::operator=(Event&&) noexcept = default;

void Event::record(Stream stream) {
  if (!impl_->event)
    CUDA_CHECK(
        cudaEventCreateWithFlags(&impl_->event, impl_->timing ? cudaEventDefault : cudaEventDisableTiming));
  CUDA_CHECK(cudaEventRecord(impl_->event, as_cuda(stream)));
}

bool Event::recorded() const { return impl_->event != nullptr; }

void Event::wait(const FailurePoll& failed) const {
  if (!impl_->event) throw std::logic_error("runtime::Event::wait before record");
  wait_for(impl_->event, failed);
}

double seconds_between(const Event& from, const Event& to) {
  if (!from.impl_->event || !to.impl_->event)
    throw std::logic_error("runtime::seconds_between: an event not recorded");
  // Normally complete a step later (then these return at once); if not, wait rather than report a wrong time.
  CUDA_CHECK(cudaEventSynchronize(from.impl_->event));
  CUDA_CHECK(cudaEventSynchronize(to.impl_->event));
  float ms = 0.0f;
  CUDA_CHECK(cudaEventElapsedTime(&ms, from.impl_->event, to.impl_->event));
  return static_cast<double>(ms) * 1e-3;
}

// ---- ScalarReadback

struct ScalarReadback::Impl {
  void* host = nullptr;  // 8 bytes of pinned memory, allocated at the first copy
  cudaEvent_t copied = nullptr;
  bool f32 = false;
  ~Impl() {
    if (copied) cudaEventDestroy(copied);
    if (host) cudaFreeHost(host);
  }
};

ScalarReadback::ScalarReadback() : impl_(std::make_unique<Impl>()) {}
ScalarReadback::~ScalarReadback() = default;

void ScalarReadback::copy_from(const Tensor& scalar) {
  if (scalar.numel() != 1 || (scalar.dtype() != DType::f32 && scalar.dtype() != DType::f64))
    throw std::invalid_argument("ScalarReadback: expected one f32/f64 element, got " + scalar.str());
  Impl& s = *impl_;
  if (!s.host) {
    CUDA_CHECK(cudaMallocHost(&s.host, sizeof(double)));
    CUDA_CHECK(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming));
  }
  s.f32 = scalar.dtype() == DType::f32;
  CUDA_CHECK(
      cudaMemcpyAsync(s.host, scalar.raw_data(), scalar.nbytes(), cudaMemcpyDeviceToHost, cuda_stream()));
  CUDA_CHECK(cudaEventRecord(s.copied, cuda_stream()));
}

double ScalarReadback::value(const FailurePoll& failed) const {
  const Impl& s = *impl_;
  if (!s.host) throw std::logic_error("ScalarReadback::value before copy_from");
  wait_for(s.copied, failed);
  return s.f32 ? static_cast<double>(*static_cast<const float*>(s.host))
               : *static_cast<const double*>(s.host);
}

// ---- Device memory

DeviceMemoryStats device_memory_stats() {
  const CudaMemoryStats m = cuda_memory_stats();
  return {m.allocated_bytes,     m.reserved_bytes, m.peak_allocated_bytes,
          m.peak_reserved_bytes, m.device_mallocs, m.device_frees};
}

std::string convolution_summary() { return cuda_conv_summary(); }

void reset_peak_device_memory() { cuda_reset_peak_memory_stats(); }

std::optional<int64_t> device_total_memory() {
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) return std::nullopt;
  return static_cast<int64_t>(total_bytes);
}

// ---- Graph

struct Graph::Impl {
  cuda::CudaGraph graph;
};

Graph::Graph() : impl_(std::make_unique<Impl>()) {}
Graph::~Graph() = default;
void Graph::capture(const std::function<void()>& f) { impl_->graph.capture(f); }
void Graph::replay() { impl_->graph.replay(); }
bool Graph::captured() const { return impl_->graph.captured(); }
size_t Graph::nodes() const { return impl_->graph.nodes(); }

// ---- Input uploads

Allocator* pinned_host_allocator() { return &cuda::pinned_host_allocator(); }

struct Upload::Impl {
  cuda::AsyncUpload upload;
};

Upload::Upload() = default;
Upload::~Upload() = default;
Upload::Upload(Upload&&) noexcept = default;
Upload& Upload::operator=(Upload&&) noexcept = default;

const std::vector<Tensor>& Upload::device_tensors_for_compute() {
  if (!impl_) throw std::logic_error("runtime::Upload: no upload");
  return impl_->upload.device_tensors_for_compute();
}

struct CopyStream::Impl {
  cuda::CopyStream stream;
};

CopyStream::CopyStream() : impl_(std::make_unique<Impl>()) {}
CopyStream::~CopyStream() = default;

Upload CopyStream::upload(std::vector<Tensor> host) {
  Upload u;
  u.impl_ = std::make_unique<Upload::Impl>(Upload::Impl{impl_->stream.upload(std::move(host))});
  return u;
}

Tensor normalize_u8_nhwc(const Tensor& u8_nhwc, const std::vector<float>& mean, const std::vector<float>& std,
                         MemoryFormat format) {
  return cuda::normalize_u8_nhwc(u8_nhwc, mean, std, format);
}

}  // namespace trainer::runtime
