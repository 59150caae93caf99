#pragma once
// The phases a training step's time is split into, and the timer interface the step reports them to
// (dist/data_parallel_step.h). metrics/step_timer.h times them; they live here, below metrics/, because
// the step that reports them is dist's.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace trainer {

// The phases of a step. The first seven are exclusive: they do not overlap one another, so with `other`
// they add up to `step` and stack into a breakdown. allreduce_total is the whole communication time,
// which overlaps backward; allreduce_exposed is the part of it the step waits for after backward.
enum class Phase : uint8_t {
  data_wait,          // waiting for the loader's next batch (host)
  h2d,                // host-to-device copy of the batch and its normalisation
  forward,            // model forward and loss
  backward,           // loss.backward(), including bucket all-reduces launched during it
  allreduce_exposed,  // waiting for gradient all-reduces still running after backward
  optimizer,          // clipping, unscaling, optimizer.step(), zero_grad()
  graph,              // forward to optimizer replayed as one CUDA graph (train.cuda_graph); replaces them
  allreduce_total,    // first all-reduce launch to last completion; overlaps backward
  step,               // begin_step() to end_step()
  other,              // step minus the seven exclusive phases (bookkeeping, logging, untimed work); derived
};
inline constexpr std::size_t kNumPhases = 10;
inline constexpr std::array<Phase, 7> kExclusivePhases = {
    Phase::data_wait,         Phase::h2d,       Phase::forward, Phase::backward,
    Phase::allreduce_exposed, Phase::optimizer, Phase::graph};
// Every phase, in enum order; phase_name() gives the label the exporter and the logs use.
inline constexpr std::array<Phase, kNumPhases> kAllPhases = {
    Phase::data_wait, Phase::h2d,   Phase::forward,         Phase::backward, Phase::allreduce_exposed,
    Phase::optimizer, Phase::graph, Phase::allreduce_total, Phase::step,     Phase::other};
std::string_view phase_name(Phase p);  // "data_wait", "h2d", ...

// Where a step reports its phases: metrics' StepTimer while training; none while a step is captured
// as a CUDA graph (an event recorded in a capture cannot be timed) or benchmarked.
class PhaseTimer {
 public:
  virtual ~PhaseTimer() = default;
  virtual void begin(Phase p) = 0;
  virtual void end(Phase p) = 0;
  // Whether `p` has an open interval (allreduce_total: opened by the gradient reducer's first launch,
  // only in steps that communicate).
  virtual bool is_open(Phase p) const = 0;
};

}  // namespace trainer
