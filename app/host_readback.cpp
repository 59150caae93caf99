#include "app/host_readback.h"

#include <stdexcept>

#ifdef TRAINER_WITH_CUDA
#include <cuda_runtime.h>

#include "nn/cuda/cuda_backend.h"
#endif

namespace trainer {

#ifdef TRAINER_WITH_CUDA
struct HostReadback::Slot {
  void* host = nullptr;  // 8 bytes of pinned memory
  cudaEvent_t copied = nullptr;
  ~Slot() {
    if (copied) cudaEventDestroy(copied);
    if (host) cudaFreeHost(host);
  }
};
#else
struct HostReadback::Slot {};
#endif

HostReadback::HostReadback() = default;
HostReadback::~HostReadback() = default;

std::function<double()> HostReadback::read_later(const Tensor& scalar) {
  if (scalar.numel() != 1 || (scalar.dtype() != DType::f32 && scalar.dtype() != DType::f64))
    throw std::invalid_argument("HostReadback: expected one f32/f64 element, got " + scalar.str());
  if (scalar.device().is_cpu()) {
    const double value = scalar.item();
    return [value] { return value; };
  }
#ifdef TRAINER_WITH_CUDA
  // A free slot is one no pending function holds any more.
  std::shared_ptr<Slot> slot;
  for (const std::shared_ptr<Slot>& s : slots_)
    if (s.use_count() == 1) slot = s;
  if (!slot) {
    slot = slots_.emplace_back(std::make_shared<Slot>());
    CUDA_CHECK(cudaMallocHost(&slot->host, sizeof(double)));
    CUDA_CHECK(cudaEventCreateWithFlags(&slot->copied, cudaEventDisableTiming));
  }
  CUDA_CHECK(
      cudaMemcpyAsync(slot->host, scalar.raw_data(), scalar.nbytes(), cudaMemcpyDeviceToHost, cuda_stream()));
  CUDA_CHECK(cudaEventRecord(slot->copied, cuda_stream()));
  const bool f32 = scalar.dtype() == DType::f32;
  return [slot, f32] {
    CUDA_CHECK(cudaEventSynchronize(slot->copied));
    return f32 ? static_cast<double>(*static_cast<const float*>(slot->host))
               : *static_cast<const double*>(slot->host);
  };
#else
  throw std::logic_error("HostReadback: a device tensor in a build without CUDA");
#endif
}

StepFence::StepFence() = default;

StepFence::~StepFence() {
#ifdef TRAINER_WITH_CUDA
  for (void* e : events_)
    if (e) cudaEventDestroy(static_cast<cudaEvent_t>(e));
#endif
}

void StepFence::step_queued(Device device) {
  if (!device.is_cuda()) return;
#ifdef TRAINER_WITH_CUDA
  const int mine = next_, previous = next_ ^ 1;
  next_ = previous;
  if (!events_[mine]) {
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    events_[mine] = e;
  }
  CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(events_[mine]), cuda_stream()));
  recorded_[mine] = true;
  if (recorded_[previous]) CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(events_[previous])));
#endif
}

}  // namespace trainer
