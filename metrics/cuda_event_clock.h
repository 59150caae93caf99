#pragma once
// The device PhaseClock: phase boundaries on the compute or communication stream are CUDA events
// recorded on that stream (cudaEventRecord never blocks the host), host boundaries are steady-clock
// readings. Elapsed times are read lag() steps later (default 1), when the events have completed
// in all but pathological cases, so timing adds no device synchronisation to the step; reading a step
// whose events have not completed waits for them (cudaEventSynchronize) rather than guessing.
//
// Only built with the CUDA backend (TRAINER_WITH_CUDA). Use it as
//   StepTimer timer(std::make_unique<CudaEventClock>(cuda_stream(), comm_stream));
// where comm_stream is the stream the gradient all-reduces run on (the compute stream at world size 1).
// The step itself (begin_step/end_step) and data_wait are host marks; h2d, forward, backward,
// allreduce_exposed and optimizer are compute-stream events; allreduce_total spans comm-stream events.
// `other` = host step time minus the device-timed phases: with the host waiting for the device once a
// step (loss.item()), the two timelines advance together and the difference is the host-side overhead.
#include "metrics/step_timer.h"

#if defined(TRAINER_WITH_CUDA) && TRAINER_WITH_CUDA
#include <cuda_runtime_api.h>

#include <chrono>
#include <vector>

namespace trainer {

class CudaEventClock final : public PhaseClock {
 public:
  // Events are created on the current device; pass the streams the step's work is queued on.
  CudaEventClock(cudaStream_t compute, cudaStream_t comm, int lag = 1);
  ~CudaEventClock() override;
  CudaEventClock(const CudaEventClock&) = delete;
  CudaEventClock& operator=(const CudaEventClock&) = delete;

  Mark mark(Timeline where) override;
  double seconds(Mark from, Mark to) override;
  void release(Mark m) override;
  int lag() const override { return lag_; }
  std::size_t events_created() const { return events_created_; }  // the pool's size; stops growing

 private:
  struct Slot {
    cudaEvent_t event = nullptr;  // created on first use as a device mark, then reused
    std::chrono::steady_clock::time_point host;
    bool on_device = false;
  };
  cudaStream_t compute_, comm_;
  int lag_;
  std::vector<Slot> slots_;
  std::vector<Mark> free_device_, free_host_;  // released slots with and without an event
  std::size_t events_created_ = 0;
};

}  // namespace trainer
#endif
