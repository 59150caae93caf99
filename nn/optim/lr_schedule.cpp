#include "nn/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>

namespace trainer {
namespace {

// OneCycleLR constants (PyTorch's defaults, except pct_start which PyTorch sets to 0.3).
constexpr double kOneCycleDivFactor = 25.0;
constexpr double kOneCycleFinalDivFactor = 1e4;
constexpr double kOneCyclePctStart = 0.25;

void require(bool ok, const ScheduleOptions& o, const std::string& message) {
  if (!ok)
    throw std::invalid_argument("lr schedule '" + std::string(schedule_kind_name(o.kind)) + "': " + message);
}

// PyTorch's _annealing_cos: from start (pct 0) to end (pct 1) along half a cosine.
double cos_anneal(double start, double end, double pct) {
  return end + (start - end) / 2.0 * (std::cos(std::numbers::pi * pct) + 1.0);
}

class Schedule : public LrSchedule {
 public:
  explicit Schedule(ScheduleOptions o) : o_(std::move(o)) {}
  std::string name() const override { return std::string(schedule_kind_name(o_.kind)); }
  double factor(int64_t step) const override {
    if (step < 0) throw std::invalid_argument("lr schedule: negative step " + std::to_string(step));
    return warmup(step) * main(step);
  }

 protected:
  virtual double main(int64_t step) const = 0;
  virtual bool linear_warmup() const { return true; }
  const ScheduleOptions& o_ref() const { return o_; }

 private:
  // torch LinearLR(start_factor, end_factor=1, total_iters=warmup_steps).
  double warmup(int64_t step) const {
    if (!linear_warmup() || step >= o_.warmup_steps) return 1.0;
    return o_.warmup_start_factor +
           (1.0 - o_.warmup_start_factor) * static_cast<double>(step) / static_cast<double>(o_.warmup_steps);
  }
  ScheduleOptions o_;
};

class ConstantSchedule final : public Schedule {
 public:
  using Schedule::Schedule;

 protected:
  double main(int64_t) const override { return 1.0; }
};

class StepSchedule final : public Schedule {
 public:
  using Schedule::Schedule;

 protected:
  double main(int64_t step) const override {
    const ScheduleOptions& o = o_ref();
    return std::pow(o.gamma, static_cast<double>(step / (o.step_epochs * o.steps_per_epoch)));
  }
};

class MultiStepSchedule final : public Schedule {
 public:
  using Schedule::Schedule;

 protected:
  double main(int64_t step) const override {
    const ScheduleOptions& o = o_ref();
    const int64_t epoch = step / o.steps_per_epoch;
    const auto passed =
        std::upper_bound(o.milestones.begin(), o.milestones.end(), epoch) - o.milestones.begin();
    return std::pow(o.gamma, static_cast<double>(passed));
  }
};

class CosineSchedule final : public Schedule {
 public:
  using Schedule::Schedule;

 protected:
  double main(int64_t step) const override {
    const ScheduleOptions& o = o_ref();
    const int64_t span = o.total_steps - o.warmup_steps;
    const int64_t t = std::clamp<int64_t>(step - o.warmup_steps, 0, span);
    return o.min_lr_factor +
           (1.0 - o.min_lr_factor) *
               (1.0 + std::cos(std::numbers::pi * static_cast<double>(t) / static_cast<double>(span))) / 2.0;
  }
};

class OneCycleSchedule final : public Schedule {
 public:
  explicit OneCycleSchedule(ScheduleOptions o) : Schedule(std::move(o)) {
    const ScheduleOptions& opt = o_ref();
    // torch: phase ends are float(pct_start * total_steps) - 1 and total_steps - 1.
    rise_end_ = opt.warmup_steps > 0 ? static_cast<double>(opt.warmup_steps) - 1.0
                                     : kOneCyclePctStart * static_cast<double>(opt.total_steps) - 1.0;
    fall_end_ = static_cast<double>(opt.total_steps) - 1.0;
  }

 protected:
  bool linear_warmup() const override { return false; }
  double main(int64_t step) const override {
    const double initial = 1.0 / kOneCycleDivFactor, final = initial / kOneCycleFinalDivFactor;
    const double s = static_cast<double>(step);
    if (s <= rise_end_) return cos_anneal(initial, 1.0, s / rise_end_);
    // Past the last step torch raises; we stay at the final value.
    const double pct = std::min(1.0, (s - rise_end_) / (fall_end_ - rise_end_));
    return cos_anneal(1.0, final, pct);
  }

 private:
  double rise_end_ = 0.0, fall_end_ = 0.0;
};

void validate(const ScheduleOptions& o) {
  require(o.warmup_steps >= 0, o, "warmup_steps must be >= 0, got " + std::to_string(o.warmup_steps));
  require(
      std::isfinite(o.warmup_start_factor) && o.warmup_start_factor >= 0.0 && o.warmup_start_factor <= 1.0, o,
      "warmup_start_factor must be in [0, 1], got " + std::to_string(o.warmup_start_factor));
  require(o.total_steps >= 0, o, "total_steps must be >= 0, got " + std::to_string(o.total_steps));
  if (o.kind == ScheduleKind::step || o.kind == ScheduleKind::multistep) {
    require(o.steps_per_epoch > 0, o,
            "steps_per_epoch must be > 0, got " + std::to_string(o.steps_per_epoch));
    require(std::isfinite(o.gamma) && o.gamma > 0.0, o, "gamma must be > 0, got " + std::to_string(o.gamma));
  }
  if (o.kind == ScheduleKind::step)
    require(o.step_epochs > 0, o, "step_epochs must be > 0, got " + std::to_string(o.step_epochs));
  if (o.kind == ScheduleKind::multistep) {
    for (size_t i = 0; i < o.milestones.size(); ++i) {
      require(o.milestones[i] >= 1, o,
              "milestones must be epochs >= 1, got " + std::to_string(o.milestones[i]));
      require(i == 0 || o.milestones[i] > o.milestones[i - 1], o, "milestones must be strictly increasing");
    }
  }
  if (o.kind == ScheduleKind::cosine) {
    require(o.total_steps > o.warmup_steps, o,
            "total_steps (" + std::to_string(o.total_steps) + ") must exceed warmup_steps (" +
                std::to_string(o.warmup_steps) + ")");
    require(std::isfinite(o.min_lr_factor) && o.min_lr_factor >= 0.0, o,
            "min_lr_factor must be >= 0, got " + std::to_string(o.min_lr_factor));
  }
  if (o.kind == ScheduleKind::onecycle) {
    if (o.warmup_steps > 0)
      require(o.warmup_steps >= 2 && o.warmup_steps < o.total_steps, o,
              "needs 2 <= warmup_steps < total_steps, got warmup_steps " + std::to_string(o.warmup_steps) +
                  " and total_steps " + std::to_string(o.total_steps));
    else
      require(kOneCyclePctStart * static_cast<double>(o.total_steps) > 1.0, o,
              "needs total_steps > 4 (the rising phase is a quarter of them), got " +
                  std::to_string(o.total_steps));
  }
}

}  // namespace

std::string_view schedule_kind_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::step:
      return "step";
    case ScheduleKind::multistep:
      return "multistep";
    case ScheduleKind::cosine:
      return "cosine";
    case ScheduleKind::onecycle:
      return "onecycle";
    case ScheduleKind::constant:
      break;
  }
  return "constant";
}

bool cut_warmup_to_fit(ScheduleOptions& options) {
  if (options.total_steps <= 0 || options.warmup_steps < options.total_steps) return false;
  options.warmup_steps = options.total_steps / 2;
  return true;
}

std::unique_ptr<LrSchedule> make_lr_schedule(const ScheduleOptions& options) {
  validate(options);
  if (options.kind == ScheduleKind::step) return std::make_unique<StepSchedule>(options);
  if (options.kind == ScheduleKind::multistep) return std::make_unique<MultiStepSchedule>(options);
  if (options.kind == ScheduleKind::cosine) return std::make_unique<CosineSchedule>(options);
  if (options.kind == ScheduleKind::onecycle) return std::make_unique<OneCycleSchedule>(options);
  return std::make_unique<ConstantSchedule>(options);
}

}  // namespace trainer
