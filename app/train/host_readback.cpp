#include "app/train/host_readback.h"

#include <stdexcept>

#ifdef TRAINER_WITH_CUDA
#include <cuda_runtime.h>

#include <chrono>
#include <thread>

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

#ifdef TRAINER_WITH_CUDA
namespace {

// Until `event` has completed: in the driver without a check; else polling, calling `failed` between
// polls (naps of at most 50 us, so the host resumes promptly when the event completes).
void wait_for(cudaEvent_t event, const WaitCheck& failed) {
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
#endif

HostReadback::HostReadback(WaitCheck failed) : failed_(std::move(failed)) {}
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
  return [slot, f32, failed = failed_] {
    wait_for(slot->copied, failed);
    return f32 ? static_cast<double>(*static_cast<const float*>(slot->host))
               : *static_cast<const double*>(slot->host);
  };
#else
  throw std::logic_error("HostReadback: a device tensor in a build without CUDA");
#endif
}

StepFence::StepFence(WaitCheck failed) : failed_(std::move(failed)) {}

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
  if (events_[previous]) wait_for(static_cast<cudaEvent_t>(events_[previous]), failed_);
#endif
}

}  // namespace trainer
