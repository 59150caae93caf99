#pragma once
// The clock the training loop's StepTimer reads. On a GPU, phases are CUDA events on the streams that
// run them (compute, and NCCL's communication stream), read a step late: the host timestamps around an
// asynchronous launch would time the launch, not the work, and reading events at once would add a
// device synchronisation per phase. On the CPU, the steady clock.
#include <memory>

#include "dist/comm.h"
#include "metrics/step_timer.h"
#include "nn/device.h"

namespace trainer {

std::unique_ptr<PhaseClock> phase_clock_for(const Device& device, const Comm& comm);

}  // namespace trainer
