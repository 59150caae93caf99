#pragma once
// Learning-rate schedules evaluated per optimizer step: factor(step) multiplies the base LR for the
// update at 0-based step `step`; the training loop calls optimizer.set_lr(base_lr * factor(step))
// before every step(). Closed forms, so resuming from a checkpoint needs only the step number.
//
//   constant   1
//   step       gamma ^ floor(step / (step_epochs * steps_per_epoch))          (torch StepLR)
//   multistep  gamma ^ (number of milestone epochs <= step / steps_per_epoch) (torch MultiStepLR)
//   cosine     after warmup, min + (1 - min) * (1 + cos(pi * t / T)) / 2 with t = step - warmup_steps
//              and T = total_steps - warmup_steps; stays at min from t = T (torch CosineAnnealingLR)
//   onecycle   torch OneCycleLR (anneal cos, div_factor 25, final_div_factor 1e4, pct_start 0.25 or
//              warmup_steps when > 0), relative to the maximum LR: 1/25 -> 1 -> 1/25/1e4
//
// Every schedule but onecycle is multiplied by a linear warmup from warmup_start_factor (step 0) to 1
// (step warmup_steps), torch LinearLR; onecycle's rising phase is its own warmup.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace trainer {

enum class ScheduleKind { constant, step, multistep, cosine, onecycle };
// "constant", "step", ...: the config's names (schedule.name) and the log's.
std::string_view schedule_kind_name(ScheduleKind kind);

struct ScheduleOptions {
  ScheduleKind kind = ScheduleKind::constant;
  int64_t total_steps = 0;      // cosine, onecycle
  int64_t steps_per_epoch = 0;  // step, multistep
  int64_t warmup_steps = 0;
  double warmup_start_factor = 0.1;
  int64_t step_epochs = 30;              // step: decay every this many epochs
  std::vector<int64_t> milestones = {};  // multistep: epochs at which to decay, increasing
  double gamma = 0.1;                    // step, multistep
  double min_lr_factor = 0.0;            // cosine: final factor
};

class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  // Multiplier of the base LR at 0-based optimizer step `step` (>= 0).
  virtual double factor(int64_t step) const = 0;
  virtual std::string name() const = 0;
};

// Throws std::invalid_argument for inconsistent options.
std::unique_ptr<LrSchedule> make_lr_schedule(const ScheduleOptions& options);

// A warm-up at least as long as the whole schedule (total_steps > 0) leaves the schedule no room of its
// own (cosine and onecycle refuse it): such a warm-up is cut to half the schedule, so the schedule's
// decay keeps the other half. Returns true when it cut options.warmup_steps. A schedule longer than its
// warm-up is never changed: a run that stops early (max_steps) must follow the full run's LR curve.
bool cut_warmup_to_fit(ScheduleOptions& options);

}  // namespace trainer
