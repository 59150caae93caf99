#include "app/train/phase_clock.h"

#include "metrics/event_phase_clock.h"
#include "nn/runtime.h"

namespace trainer {

std::unique_ptr<PhaseClock> phase_clock_for(const Device& device, const Comm& comm) {
  if (device.is_cuda()) {
    // A communicator without a stream of its own (world size 1, or the CPU communicator) runs no
    // gradient work on another stream.
    const runtime::Stream compute = runtime::compute_stream();
    const runtime::Stream comm_stream = comm.stream() ? comm.stream() : compute;
    return std::make_unique<EventPhaseClock>(compute, comm_stream);
  }
  return std::make_unique<SteadyPhaseClock>();
}

}  // namespace trainer
