#pragma once
// Where a training step's time goes: a StepTimer splits each step into named phases and keeps rolling
// statistics (mean, p50, p90) over the last steps for the log; the exporter turns each resolved step
// into histogram observations.
//
// Time comes from a PhaseClock. The CPU clock reads std::chrono::steady_clock and resolves a step at
// once. A device clock (CUDA) cannot read device time without synchronising, so it records an event
// per phase boundary on the stream that runs the phase and reads the elapsed times only `lag()` steps
// later, when those events have long completed: no extra device sync in the hot path. That is why
// end_step() returns an optional: with a lagging clock it returns the times of an older step (its
// `step` field says which), and flush() drains the rest when training ends.
//
// Per step (grad_accum_steps = k: one step spans k micro-batches and one optimizer step):
//   timer.begin_step();
//   for each micro-batch:
//     timer.begin(Phase::data_wait); batch = loader.next(); timer.end(Phase::data_wait);
//     timer.begin(Phase::h2d);       x = batch.to(device);  timer.end(Phase::h2d);
//     timer.begin(Phase::forward);   loss = ...;            timer.end(Phase::forward);
//     timer.begin(Phase::backward);  loss.backward();       timer.end(Phase::backward);
//   timer.begin(Phase::allreduce_exposed); reducer.finish(); timer.end(Phase::allreduce_exposed);
//   timer.add(Phase::allreduce_total, reducer.last_seconds());   // or begin/end on Timeline::comm
//   timer.begin(Phase::optimizer); opt.step(); timer.end(Phase::optimizer);
//   if (auto t = timer.end_step()) exporter.observe_step(*t);
// and at the end of an epoch: timer.discard_step() (a step the loader cut short), then
//   for (const StepTimes& t : timer.flush()) exporter.observe_step(t);
// A phase may be entered several times per step (once per micro-batch): its intervals add up.
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dist/step_phases.h"

namespace trainer {

// Where a phase boundary is timed. The CPU clock has one timeline for all three; a CUDA clock records
// events on the compute or communication stream and reads the host clock for `host`. Both ends of
// one interval are on the same timeline.
enum class Timeline : uint8_t { host, compute, comm };
// data_wait on host, allreduce_total on comm, the rest (including allreduce_exposed: the compute
// stream's wait for the comm stream) on compute.
Timeline default_timeline(Phase p);

// Source of time marks. Implementations must not block in mark().
class PhaseClock {
 public:
  using Mark = uint32_t;  // a handle owned by the clock until release()
  virtual ~PhaseClock() = default;
  // Records "now" on `where` and returns its handle.
  virtual Mark mark(Timeline where) = 0;
  // Seconds from `from` to `to` (both from mark() on the same timeline). Called only for marks at least
  // lag() steps old; may wait for them then (a CUDA clock: cudaEventSynchronize, normally instant).
  virtual double seconds(Mark from, Mark to) = 0;
  // The mark is no longer needed (a CUDA clock returns the event to its pool).
  virtual void release(Mark m) = 0;
  // How many steps a step's times are read after it ended: 0 = at once.
  virtual int lag() const { return 0; }
};

// The CPU clock: std::chrono::steady_clock on every timeline, lag 0.
class SteadyPhaseClock final : public PhaseClock {
 public:
  Mark mark(Timeline where) override;
  double seconds(Mark from, Mark to) override;
  void release(Mark m) override;

 private:
  std::vector<std::chrono::steady_clock::time_point> times_;
  std::vector<Mark> free_;
};

// One step's seconds per phase.
struct StepTimes {
  int64_t step = 0;  // 1-based: the n-th begin_step() of this timer
  std::array<double, kNumPhases> seconds{};
  double operator[](Phase p) const { return seconds[static_cast<std::size_t>(p)]; }
  double& operator[](Phase p) { return seconds[static_cast<std::size_t>(p)]; }
};

// Statistics of one phase over the rolling window.
struct PhaseStats {
  std::size_t count = 0;  // steps in the window
  double mean = 0.0, p50 = 0.0, p90 = 0.0, max = 0.0;
};

// The last `capacity` values of a series: mean and linearly interpolated quantiles (numpy's default).
class RollingWindow {
 public:
  explicit RollingWindow(std::size_t capacity);
  void push(double v);
  void clear();
  std::size_t size() const { return size_; }
  std::size_t capacity() const { return values_.size(); }
  double mean() const;
  double quantile(double q) const;  // q in [0, 1]; 0 when empty
  double max() const;

 private:
  std::vector<double> values_;  // ring buffer
  std::size_t next_ = 0, size_ = 0;
  double sum_ = 0.0;
};

class StepTimer final : public PhaseTimer {
 public:
  // window: how many resolved steps the rolling statistics cover.
  explicit StepTimer(std::unique_ptr<PhaseClock> clock = std::make_unique<SteadyPhaseClock>(),
                     std::size_t window = 100);
  ~StepTimer();
  StepTimer(const StepTimer&) = delete;
  StepTimer& operator=(const StepTimer&) = delete;

  void begin_step();
  // Opens an interval of `p` (any phase but step and other) on its default timeline, or on `where`.
  void begin(Phase p) override;
  void begin(Phase p, Timeline where);
  void end(Phase p) override;
  bool is_open(Phase p) const override;
  // Adds seconds measured elsewhere (e.g. by the gradient reducer's thread) to this step's `p`.
  // Called with each phase begin() opens (the heartbeat reports it to the other ranks).
  void set_phase_observer(std::function<void(Phase)> observer) { phase_observer_ = std::move(observer); }
  void add(Phase p, double seconds);
  // Closes the step. Returns the times of the oldest step that can be read now: this one with a lag-0
  // clock, the one `lag()` steps back otherwise (nullopt while fewer steps have ended).
  std::optional<StepTimes> end_step();
  // Drops the step begun last without timing it (a step cut short: the loader ran out mid-accumulation,
  // a stop signal); open phases are dropped with it. No-op outside a step.
  void discard_step();
  // Reads every step still pending (at the end of an epoch and of training; waits for the device).
  std::vector<StepTimes> flush();

  bool in_step() const { return in_step_; }
  int64_t steps_begun() const { return steps_begun_; }
  // Rolling statistics over the last `window` resolved steps.
  PhaseStats stats(Phase p) const;
  // One log line, e.g. "step 41.2ms p50 40.9 p90 44.0 | data_wait 0.3ms 1% | h2d ... | other ..."
  // (means over the window; shares of the mean step). Empty before the first resolved step.
  std::string summary() const;
  void reset_stats();

 private:
  struct Interval {
    Phase phase;
    PhaseClock::Mark from, to;
  };
  struct PendingStep {
    int64_t step = 0;
    PhaseClock::Mark begin = 0, end = 0;
    std::vector<Interval> intervals;
    std::array<double, kNumPhases> added{};
  };
  StepTimes resolve(PendingStep& s);

  std::unique_ptr<PhaseClock> clock_;
  std::deque<PendingStep> pending_;  // ended, not yet read
  std::vector<PendingStep> spare_;   // recycled records (keeps their vectors' capacity)
  PendingStep current_;
  std::array<bool, kNumPhases> open_{};  // phase has an open interval
  std::array<PhaseClock::Mark, kNumPhases> open_mark_{};
  std::array<Timeline, kNumPhases> open_where_{};
  bool in_step_ = false;
  int64_t steps_begun_ = 0;
  std::vector<RollingWindow> windows_;  // one per phase
  std::function<void(Phase)> phase_observer_;
};

// Times a scope as one interval of a phase: { PhaseScope s(timer, Phase::forward); ... }.
class PhaseScope {
 public:
  PhaseScope(StepTimer& timer, Phase p) : timer_(timer), phase_(p) { timer_.begin(p); }
  ~PhaseScope() { timer_.end(phase_); }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  StepTimer& timer_;
  Phase phase_;
};

}  // namespace trainer
