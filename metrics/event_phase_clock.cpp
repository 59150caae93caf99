#include "metrics/event_phase_clock.h"

#include <stdexcept>

namespace trainer {

EventPhaseClock::EventPhaseClock(runtime::Stream compute, runtime::Stream comm, int lag)
    : compute_(compute), comm_(comm), lag_(lag < 0 ? 0 : lag) {}

PhaseClock::Mark EventPhaseClock::mark(Timeline where) {
  const bool device = where != Timeline::host;
  // Device marks reuse slots that already own an event, so the pool stops growing after lag + 1 steps.
  std::vector<Mark>& same = device ? free_device_ : free_host_;
  std::vector<Mark>& other = device ? free_host_ : free_device_;
  Mark m;
  if (!same.empty()) {
    m = same.back();
    same.pop_back();
  } else if (!other.empty()) {
    m = other.back();
    other.pop_back();
  } else {
    slots_.emplace_back();
    m = static_cast<Mark>(slots_.size() - 1);
  }
  Slot& s = slots_[m];
  s.on_device = device;
  if (!s.on_device) {
    s.host = std::chrono::steady_clock::now();
    return m;
  }
  if (!s.event) {
    s.event.emplace(/*timing=*/true);
    ++events_created_;
  }
  s.event->record(where == Timeline::comm ? comm_ : compute_);
  return m;
}

double EventPhaseClock::seconds(Mark from, Mark to) {
  const Slot& a = slots_.at(from);
  const Slot& b = slots_.at(to);
  if (a.on_device != b.on_device)
    throw std::logic_error("EventPhaseClock: an interval mixes a host mark and a device mark");
  if (!a.on_device) return std::chrono::duration<double>(b.host - a.host).count();
  return runtime::seconds_between(*a.event, *b.event);
}

void EventPhaseClock::release(Mark m) { (slots_.at(m).event ? free_device_ : free_host_).push_back(m); }

}  // namespace trainer
