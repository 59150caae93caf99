#pragma once
// The device PhaseClock: phase boundaries on the compute or communication stream are device events
// recorded on that stream (nn/runtime.h; recording never blocks the host), host boundaries are
// steady-clock readings. Elapsed times are read lag() steps later (default 1), when the events have
// completed in all but pathological cases, so timing adds no device synchronisation to the step; reading
// a step whose events have not completed waits for them rather than guessing.
//
// Use it on a GPU as
//   StepTimer timer(std::make_unique<EventPhaseClock>(runtime::compute_stream(), comm_stream));
// where comm_stream is the stream the gradient all-reduces run on (Comm::stream(); the compute stream when
// the communicator has none). On the CPU the runtime's events read the steady clock, so the clock works
// there too, only without a reason to lag (the trainer uses SteadyPhaseClock).
// The step itself (begin_step/end_step) and data_wait are host marks; h2d, forward, backward,
// allreduce_exposed and optimizer are compute-stream events; allreduce_total spans comm-stream events.
// `other` = host step time minus the device-timed phases: with the host waiting for the device once a
// step (loss.item()), the two timelines advance together and the difference is the host-side overhead.
#include <chrono>
#include <optional>
#include <vector>

#include "metrics/step_timer.h"
#include "nn/runtime.h"

namespace trainer {

class EventPhaseClock final : public PhaseClock {
 public:
  // Events are created on the current device; pass the streams the step's work is queued on.
  EventPhaseClock(runtime::Stream compute, runtime::Stream comm, int lag = 1);
  EventPhaseClock(const EventPhaseClock&) = delete;
  EventPhaseClock& operator=(const EventPhaseClock&) = delete;

  Mark mark(Timeline where) override;
  double seconds(Mark from, Mark to) override;
  void release(Mark m) override;
  int lag() const override { return lag_; }
  std::size_t events_created() const { return events_created_; }  // the pool's size; stops growing

 private:
  struct Slot {
    std::optional<runtime::Event> event;  // made at the slot's first use as a device mark, then reused
    std::chrono::steady_clock::time_point host;
    bool on_device = false;
  };
  runtime::Stream compute_, comm_;
  int lag_;
  std::vector<Slot> slots_;
  std::vector<Mark> free_device_, free_host_;  // released slots with and without an event
  std::size_t events_created_ = 0;
};

}  // namespace trainer
