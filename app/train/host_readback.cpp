#include "app/train/host_readback.h"

#include <stdexcept>

namespace trainer {

// The pinned copy and its event live in the runtime (nn/runtime.h); a slot is free once no pending
// function holds it.
struct HostReadback::Slot {
  runtime::ScalarReadback scalar;
};

HostReadback::HostReadback(WaitCheck failed) : failed_(std::move(failed)) {}
HostReadback::~HostReadback() = default;

std::function<double()> HostReadback::read_later(const Tensor& scalar) {
  if (scalar.numel() != 1 || (scalar.dtype() != DType::f32 && scalar.dtype() != DType::f64))
    throw std::invalid_argument("HostReadback: expected one f32/f64 element, got " + scalar.str());
  if (scalar.device().is_cpu()) {
    const double value = scalar.item();
    return [value] { return value; };
  }
  std::shared_ptr<Slot> slot;
  for (const std::shared_ptr<Slot>& s : slots_)
    if (s.use_count() == 1) slot = s;
  if (!slot) slot = slots_.emplace_back(std::make_shared<Slot>());
  slot->scalar.copy_from(scalar);
  return [slot, failed = failed_] { return slot->scalar.value(failed); };
}

StepFence::StepFence(WaitCheck failed) : failed_(std::move(failed)) {}
StepFence::~StepFence() = default;

void StepFence::step_queued(Device device) {
  if (!device.is_cuda()) return;
  const int mine = next_, previous = next_ ^ 1;
  next_ = previous;
  events_[mine].record(runtime::compute_stream());
  if (events_[previous].recorded()) events_[previous].wait(failed_);
}

}  // namespace trainer
