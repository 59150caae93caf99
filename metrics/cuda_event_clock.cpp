#include "metrics/cuda_event_clock.h"

#if defined(TRAINER_WITH_CUDA) && TRAINER_WITH_CUDA
#include <stdexcept>
#include <string>

namespace trainer {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(
        std::string("CudaEventClock: ") + what + ": " + cudaGetErrorString(e) +
        ". HINT: an earlier kernel may have failed; rebuild with -DTRAINER_CUDA_DEBUG=ON to "
        "find it");
}

}  // namespace

CudaEventClock::CudaEventClock(cudaStream_t compute, cudaStream_t comm, int lag)
    : compute_(compute), comm_(comm), lag_(lag < 0 ? 0 : lag) {}

CudaEventClock::~CudaEventClock() {
  for (Slot& s : slots_)
    if (s.event) cudaEventDestroy(s.event);
}

PhaseClock::Mark CudaEventClock::mark(Timeline where) {
  const bool device = where != Timeline::host;
  // Device marks reuse slots that already own an event, so the pool stops growing after lag + 1 steps.
  std::vector<Mark>& same = device ? free_device_ : free_host_;
  std::vector<Mark>& other = device ? free_host_ : free_device_;
  Mark m;
  if (!same.empty()) {
    m = same.back();
    same.pop_back();
  } else if (!other.empty()) {
    m = other.back();
    other.pop_back();
  } else {
    slots_.emplace_back();
    m = static_cast<Mark>(slots_.size() - 1);
  }
  Slot& s = slots_[m];
  s.on_device = device;
  if (!s.on_device) {
    s.host = std::chrono::steady_clock::now();
    return m;
  }
  if (!s.event) {
    check(cudaEventCreate(&s.event), "cudaEventCreate");  // timing enabled (no cudaEventDisableTiming)
    ++events_created_;
  }
  check(cudaEventRecord(s.event, where == Timeline::comm ? comm_ : compute_), "cudaEventRecord");
  return m;
}

double CudaEventClock::seconds(Mark from, Mark to) {
  const Slot& a = slots_.at(from);
  const Slot& b = slots_.at(to);
  if (a.on_device != b.on_device)
    throw std::logic_error("CudaEventClock: an interval mixes a host mark and a device mark");
  if (!a.on_device) return std::chrono::duration<double>(b.host - a.host).count();
  // Normally complete a step later (then these return at once); if not, wait rather than report a wrong time.
  check(cudaEventSynchronize(a.event), "cudaEventSynchronize");
  check(cudaEventSynchronize(b.event), "cudaEventSynchronize");
  float ms = 0.0f;
  check(cudaEventElapsedTime(&ms, a.event, b.event), "cudaEventElapsedTime");
  return static_cast<double>(ms) * 1e-3;
}

void CudaEventClock::release(Mark m) { (slots_.at(m).event ? free_device_ : free_host_).push_back(m); }

}  // namespace trainer
#endif
