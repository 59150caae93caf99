#pragma once
// Device scalars read back to the host without stopping it: read_later(t) queues a copy of t into
// pinned memory and an event on the compute stream, and returns what waits for that event and gives
// the value. Called right after a step is queued and resolved after the next one is queued, the host
// never waits for the device between steps (a `.item()` would: the device then idles while the host
// queues the next step). A CPU tensor is read at once.
#include <functional>
#include <memory>
#include <vector>

#include "nn/runtime.h"
#include "nn/tensor.h"

namespace trainer {

// While a device wait can depend on a communicator's work (several ranks on GPUs), it polls and calls
// `failed` (Comm::throw_if_failed) between polls: a dead peer can leave NCCL kernels spinning, and the
// wait must end with the communicator's error, not hang. Without it, the waits block in the driver.
using WaitCheck = std::function<void()>;

class HostReadback {
 public:
  explicit HostReadback(WaitCheck failed = {});
  ~HostReadback();
  HostReadback(const HostReadback&) = delete;
  HostReadback& operator=(const HostReadback&) = delete;

  // `scalar`: one f32 or f64 element. The returned function may be called once or more, while this
  // HostReadback lives; its slot is reused once the function is gone.
  std::function<double()> read_later(const Tensor& scalar);

 private:
  struct Slot;
  std::vector<std::shared_ptr<Slot>> slots_;
  WaitCheck failed_;
};

// Keeps the host at most one step ahead of the device, and puts its wait inside the step: step_queued()
// records an event after the step just queued and waits for the one recorded after the step before
// it. Without it the host, which queues a step faster than the device runs it, waited only when the
// step timer resolved an older step's events -- after the step's end mark -- so host-measured step
// times left the wait out and trainer bench reported twice the real img/s of eager steps. No-op on the
// CPU.
class StepFence {
 public:
  explicit StepFence(WaitCheck failed = {});
  ~StepFence();
  StepFence(const StepFence&) = delete;
  StepFence& operator=(const StepFence&) = delete;
  void step_queued(Device device);

 private:
  runtime::Event events_[2];  // recorded alternately (made on the device when first recorded)
  int next_ = 0;
  WaitCheck failed_;
};

}  // namespace trainer
