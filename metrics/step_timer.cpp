#include "metrics/step_timer.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

namespace trainer {
namespace {

std::size_t idx(Phase p) { return static_cast<std::size_t>(p); }

bool is_timed(Phase p) { return p != Phase::step && p != Phase::other && idx(p) < kNumPhases; }

std::string format_ms(double seconds) {
  char buf[32];
  const double ms = seconds * 1e3;
  std::snprintf(buf, sizeof buf, ms >= 100 ? "%.0f" : ms >= 10 ? "%.1f" : "%.2f", ms);
  return buf;
}

}  // namespace

Timeline default_timeline(Phase p) {
  switch (p) {
    case Phase::data_wait:
    case Phase::step:
    case Phase::other:
      return Timeline::host;
    case Phase::allreduce_total:
      return Timeline::comm;
    default:
      return Timeline::compute;
  }
}

// ---- SteadyPhaseClock

PhaseClock::Mark SteadyPhaseClock::mark(Timeline) {
  const auto now = std::chrono::steady_clock::now();
  if (!free_.empty()) {
    const Mark m = free_.back();
    free_.pop_back();
    times_[m] = now;
    return m;
  }
  times_.push_back(now);
  return static_cast<Mark>(times_.size() - 1);
}

double SteadyPhaseClock::seconds(Mark from, Mark to) {
  return std::chrono::duration<double>(times_.at(to) - times_.at(from)).count();
}

void SteadyPhaseClock::release(Mark m) { free_.push_back(m); }

// ---- RollingWindow

RollingWindow::RollingWindow(std::size_t capacity) : values_(std::max<std::size_t>(capacity, 1)) {}

void RollingWindow::push(double v) {
  if (size_ == values_.size())
    sum_ -= values_[next_];
  else
    ++size_;
  values_[next_] = v;
  sum_ += v;
  next_ = (next_ + 1) % values_.size();
}

void RollingWindow::clear() {
  next_ = size_ = 0;
  sum_ = 0.0;
}

double RollingWindow::mean() const { return size_ ? sum_ / static_cast<double>(size_) : 0.0; }

double RollingWindow::quantile(double q) const {
  if (size_ == 0) return 0.0;
  std::vector<double> v(values_.begin(), values_.begin() + static_cast<std::ptrdiff_t>(size_));
  std::sort(v.begin(), v.end());
  const double pos = std::clamp(q, 0.0, 1.0) * static_cast<double>(size_ - 1);
  const auto lo = static_cast<std::size_t>(pos);
  const std::size_t hi = std::min(lo + 1, size_ - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

double RollingWindow::max() const {
  if (size_ == 0) return 0.0;
  return *std::max_element(values_.begin(), values_.begin() + static_cast<std::ptrdiff_t>(size_));
}

// ---- StepTimer

StepTimer::StepTimer(std::unique_ptr<PhaseClock> clock, std::size_t window) : clock_(std::move(clock)) {
  if (!clock_) throw std::invalid_argument("StepTimer: null clock");
  windows_.assign(kNumPhases, RollingWindow(window));
}

StepTimer::~StepTimer() = default;

void StepTimer::begin_step() {
  if (in_step_) throw std::logic_error("StepTimer::begin_step: the previous step was not ended");
  in_step_ = true;
  ++steps_begun_;
  current_.step = steps_begun_;
  current_.intervals.clear();
  current_.added.fill(0.0);
  current_.begin = clock_->mark(Timeline::host);
}

void StepTimer::begin(Phase p) { begin(p, default_timeline(p)); }

void StepTimer::begin(Phase p, Timeline where) {
  if (!is_timed(p))
    throw std::logic_error("StepTimer::begin: phase '" + std::string(phase_name(p)) +
                           "' is not timed with begin/end (use begin_step/end_step)");
  if (!in_step_)
    throw std::logic_error("StepTimer::begin(" + std::string(phase_name(p)) +
                           "): no step begun (begin_step)");
  if (open_[idx(p)])
    throw std::logic_error("StepTimer::begin(" + std::string(phase_name(p)) + "): already open");
  open_[idx(p)] = true;
  open_where_[idx(p)] = where;
  open_mark_[idx(p)] = clock_->mark(where);
  if (phase_observer_) phase_observer_(p);
}

bool StepTimer::is_open(Phase p) const { return is_timed(p) && open_[idx(p)]; }

void StepTimer::end(Phase p) {
  if (!is_timed(p) || !open_[idx(p)])
    throw std::logic_error("StepTimer::end(" + std::string(phase_name(p)) + "): not open");
  const PhaseClock::Mark to = clock_->mark(open_where_[idx(p)]);
  current_.intervals.push_back({p, open_mark_[idx(p)], to});
  open_[idx(p)] = false;
}

void StepTimer::add(Phase p, double seconds) {
  if (!is_timed(p)) throw std::logic_error("StepTimer::add: phase '" + std::string(phase_name(p)) + "'");
  if (!in_step_) throw std::logic_error("StepTimer::add(" + std::string(phase_name(p)) + "): no step begun");
  current_.added[idx(p)] += seconds;
}

std::optional<StepTimes> StepTimer::end_step() {
  if (!in_step_) throw std::logic_error("StepTimer::end_step: no step begun");
  for (Phase p : kAllPhases)
    if (open_[idx(p)])
      throw std::logic_error("StepTimer::end_step: phase '" + std::string(phase_name(p)) + "' still open");
  current_.end = clock_->mark(Timeline::host);
  in_step_ = false;
  // Hand the record to the pending queue and take a recycled one (its vector keeps its capacity).
  PendingStep next;
  if (!spare_.empty()) {
    next = std::move(spare_.back());
    spare_.pop_back();
  }
  pending_.push_back(std::move(current_));
  current_ = std::move(next);
  if (static_cast<int>(pending_.size()) <= std::max(clock_->lag(), 0)) return std::nullopt;
  StepTimes t = resolve(pending_.front());
  spare_.push_back(std::move(pending_.front()));
  pending_.pop_front();
  return t;
}

void StepTimer::discard_step() {
  if (!in_step_) return;
  for (const Interval& iv : current_.intervals) {
    clock_->release(iv.from);
    clock_->release(iv.to);
  }
  current_.intervals.clear();
  clock_->release(current_.begin);
  for (Phase p : kAllPhases)
    if (open_[idx(p)]) {
      clock_->release(open_mark_[idx(p)]);
      open_[idx(p)] = false;
    }
  in_step_ = false;
  --steps_begun_;
}

std::vector<StepTimes> StepTimer::flush() {
  std::vector<StepTimes> out;
  while (!pending_.empty()) {
    out.push_back(resolve(pending_.front()));
    spare_.push_back(std::move(pending_.front()));
    pending_.pop_front();
  }
  return out;
}

StepTimes StepTimer::resolve(PendingStep& s) {
  StepTimes t;
  t.step = s.step;
  t.seconds = s.added;
  for (const Interval& iv : s.intervals) {
    t[iv.phase] += clock_->seconds(iv.from, iv.to);
    clock_->release(iv.from);
    clock_->release(iv.to);
  }
  t[Phase::step] = clock_->seconds(s.begin, s.end);
  clock_->release(s.begin);
  clock_->release(s.end);
  double exclusive = 0.0;
  for (Phase p : kExclusivePhases) exclusive += t[p];
  t[Phase::other] = std::max(0.0, t[Phase::step] - exclusive);
  s.intervals.clear();
  for (Phase p : kAllPhases) windows_[idx(p)].push(t[p]);
  return t;
}

PhaseStats StepTimer::stats(Phase p) const {
  const RollingWindow& w = windows_[idx(p)];
  PhaseStats s;
  s.count = w.size();
  s.mean = w.mean();
  s.p50 = w.quantile(0.5);
  s.p90 = w.quantile(0.9);
  s.max = w.max();
  return s;
}

std::string StepTimer::summary() const {
  const PhaseStats step = stats(Phase::step);
  if (step.count == 0) return "";
  std::string out =
      "step " + format_ms(step.mean) + "ms p50 " + format_ms(step.p50) + " p90 " + format_ms(step.p90);
  auto part = [&](Phase p) {
    const double mean = windows_[idx(p)].mean();
    char share[16];
    std::snprintf(share, sizeof share, "%.0f%%", step.mean > 0 ? 100.0 * mean / step.mean : 0.0);
    out += " | " + std::string(phase_name(p)) + " " + format_ms(mean) + "ms " + share;
  };
  for (Phase p : kExclusivePhases) part(p);
  part(Phase::other);
  // Communication overlapping backward: total next to the exposed part above.
  if (windows_[idx(Phase::allreduce_total)].mean() > 0) part(Phase::allreduce_total);
  return out;
}

void StepTimer::reset_stats() {
  for (RollingWindow& w : windows_) w.clear();
}

}  // namespace trainer
