#include "metrics/step_timer.h"

#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <thread>

namespace trainer {
namespace {

// A clock the test moves by hand. Records the timeline of every mark, and counts marks in use so that
// a leak (a mark never released) shows.
struct FakeTime {
  double now = 0.0;
  int live_marks = 0;
  int marks_made = 0;
  std::vector<Timeline> timelines;  // of every mark, by handle
};

class FakeClock final : public PhaseClock {
 public:
  FakeClock(FakeTime& t, int lag) : t_(t), lag_(lag) {}
  Mark mark(Timeline where) override {
    times_.push_back(t_.now);
    t_.timelines.push_back(where);
    ++t_.live_marks;
    ++t_.marks_made;
    return static_cast<Mark>(times_.size() - 1);
  }
  double seconds(Mark from, Mark to) override {
    EXPECT_EQ(t_.timelines.at(from), t_.timelines.at(to)) << "an interval spans two timelines";
    return times_.at(to) - times_.at(from);
  }
  void release(Mark) override { --t_.live_marks; }
  int lag() const override { return lag_; }

 private:
  FakeTime& t_;
  int lag_;
  std::vector<double> times_;
};

StepTimer fake_timer(FakeTime& t, int lag = 0, std::size_t window = 100) {
  return StepTimer(std::make_unique<FakeClock>(t, lag), window);
}

// One data-parallel step: the all-reduce runs from 40 ms to 80 ms on the comm stream, overlapping backward
// (30-70 ms); the step waits for it from 70 to 80 ms.
void run_reference_step(StepTimer& timer, FakeTime& t, double start) {
  t.now = start;
  timer.begin_step();
  timer.begin(Phase::data_wait);
  t.now = start + 0.010;
  timer.end(Phase::data_wait);
  timer.begin(Phase::h2d);
  t.now = start + 0.012;
  timer.end(Phase::h2d);
  timer.begin(Phase::forward);
  t.now = start + 0.030;
  timer.end(Phase::forward);
  timer.begin(Phase::backward);
  t.now = start + 0.040;
  timer.begin(Phase::allreduce_total);
  t.now = start + 0.070;
  timer.end(Phase::backward);
  timer.begin(Phase::allreduce_exposed);
  t.now = start + 0.080;
  timer.end(Phase::allreduce_total);
  timer.end(Phase::allreduce_exposed);
  timer.begin(Phase::optimizer);
  t.now = start + 0.085;
  timer.end(Phase::optimizer);
  t.now = start + 0.090;  // logging after the optimizer: "other"
}

TEST(StepTimer, PhaseAccounting) {
  FakeTime t;
  StepTimer timer = fake_timer(t);
  run_reference_step(timer, t, 1.0);
  const std::optional<StepTimes> r = timer.end_step();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->step, 1);
  EXPECT_NEAR((*r)[Phase::data_wait], 0.010, 1e-12);
  EXPECT_NEAR((*r)[Phase::h2d], 0.002, 1e-12);
  EXPECT_NEAR((*r)[Phase::forward], 0.018, 1e-12);
  EXPECT_NEAR((*r)[Phase::backward], 0.040, 1e-12);
  EXPECT_NEAR((*r)[Phase::allreduce_exposed], 0.010, 1e-12);
  EXPECT_NEAR((*r)[Phase::optimizer], 0.005, 1e-12);
  EXPECT_NEAR((*r)[Phase::allreduce_total], 0.040, 1e-12);
  EXPECT_NEAR((*r)[Phase::step], 0.090, 1e-12);
  EXPECT_NEAR((*r)[Phase::other], 0.005, 1e-12);
  // The exclusive phases and other add up to the step; allreduce_total overlaps and is not part of the sum.
  double sum = (*r)[Phase::other];
  for (Phase p : kExclusivePhases) sum += (*r)[p];
  EXPECT_NEAR(sum, (*r)[Phase::step], 1e-12);
  EXPECT_EQ(t.live_marks, 0);
}

TEST(StepTimer, PhasesUseTheirTimelines) {
  FakeTime t;
  StepTimer timer = fake_timer(t);
  timer.begin_step();  // mark 0: host
  timer.begin(Phase::data_wait);
  timer.end(Phase::data_wait);  // 1, 2
  timer.begin(Phase::forward);
  timer.end(Phase::forward);  // 3, 4
  timer.begin(Phase::allreduce_total);
  timer.end(Phase::allreduce_total);  // 5, 6
  timer.begin(Phase::optimizer, Timeline::host);
  timer.end(Phase::optimizer);  // 7, 8: overridden
  timer.end_step();             // 9
  const std::vector<Timeline> expected = {
      Timeline::host, Timeline::host, Timeline::host, Timeline::compute, Timeline::compute,
      Timeline::comm, Timeline::comm, Timeline::host, Timeline::host,    Timeline::host};
  EXPECT_EQ(t.timelines, expected);
}

TEST(StepTimer, MicroBatchesAndAddedSecondsAccumulate) {
  FakeTime t;
  StepTimer timer = fake_timer(t);
  timer.begin_step();
  for (int micro = 0; micro < 3; ++micro) {
    timer.begin(Phase::forward);
    t.now += 0.1;
    timer.end(Phase::forward);
    timer.begin(Phase::backward);
    t.now += 0.2;
    timer.end(Phase::backward);
  }
  timer.add(Phase::allreduce_total, 0.25);  // measured by the reducer
  timer.add(Phase::allreduce_total, 0.05);
  const StepTimes r = *timer.end_step();
  EXPECT_NEAR(r[Phase::forward], 0.3, 1e-12);
  EXPECT_NEAR(r[Phase::backward], 0.6, 1e-12);
  EXPECT_NEAR(r[Phase::allreduce_total], 0.3, 1e-12);
  EXPECT_NEAR(r[Phase::step], 0.9, 1e-12);
  EXPECT_NEAR(r[Phase::other], 0.0, 1e-12);
}

TEST(StepTimer, PhaseScopeTimesItsBlock) {
  FakeTime t;
  StepTimer timer = fake_timer(t);
  timer.begin_step();
  {
    PhaseScope s(timer, Phase::optimizer);
    t.now += 0.5;
  }
  EXPECT_NEAR((*timer.end_step())[Phase::optimizer], 0.5, 1e-12);
}

// A device clock reads a step's events one step later; end_step() then returns the previous step and
// flush() the last one. No mark leaks.
TEST(StepTimer, LaggingClockResolvesOneStepLater) {
  FakeTime t;
  StepTimer timer = fake_timer(t, /*lag=*/1);
  run_reference_step(timer, t, 0.0);
  EXPECT_FALSE(timer.end_step().has_value());
  EXPECT_EQ(t.live_marks, 16);  // step 1 still pending: 2 step marks + 7 intervals
  run_reference_step(timer, t, 1.0);
  const std::optional<StepTimes> first = timer.end_step();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->step, 1);
  EXPECT_NEAR((*first)[Phase::step], 0.090, 1e-12);
  EXPECT_EQ(timer.stats(Phase::step).count, 1u);
  const std::vector<StepTimes> rest = timer.flush();
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(rest[0].step, 2);
  EXPECT_NEAR(rest[0][Phase::backward], 0.040, 1e-12);
  EXPECT_TRUE(timer.flush().empty());
  EXPECT_EQ(t.live_marks, 0);
  EXPECT_EQ(timer.stats(Phase::step).count, 2u);
}

// A step cut short (the loader ran dry mid-accumulation) is dropped: its marks are released, the next
// step takes its number, and the time in between counts nowhere.
TEST(StepTimer, DiscardedStepLeavesNoTrace) {
  FakeTime t;
  StepTimer timer = fake_timer(t);
  timer.discard_step();  // outside a step: nothing
  timer.begin_step();
  timer.begin(Phase::forward);
  t.now += 1.0;
  timer.end(Phase::forward);
  timer.begin(Phase::data_wait);
  t.now += 5.0;
  timer.discard_step();
  EXPECT_FALSE(timer.in_step());
  EXPECT_EQ(t.live_marks, 0);
  timer.begin_step();
  timer.begin(Phase::data_wait);  // may be opened again
  t.now += 0.5;
  timer.end(Phase::data_wait);
  const StepTimes r = *timer.end_step();
  EXPECT_EQ(r.step, 1);
  EXPECT_NEAR(r[Phase::step], 0.5, 1e-12);
  EXPECT_EQ(r[Phase::forward], 0.0);
  EXPECT_EQ(t.live_marks, 0);
}

TEST(StepTimer, RollingStatisticsOverTheWindow) {
  FakeTime t;
  StepTimer timer = fake_timer(t, 0, /*window=*/4);
  for (int i = 1; i <= 6; ++i) {  // steps of 1..6 s, forward 0.1 * i
    timer.begin_step();
    timer.begin(Phase::forward);
    t.now += 0.1 * i;
    timer.end(Phase::forward);
    t.now += 0.9 * i;
    timer.end_step();
  }
  const PhaseStats s = timer.stats(Phase::step);  // window holds 3, 4, 5, 6
  EXPECT_EQ(s.count, 4u);
  EXPECT_NEAR(s.mean, 4.5, 1e-9);
  EXPECT_NEAR(s.p50, 4.5, 1e-9);
  EXPECT_NEAR(s.p90, 5.7, 1e-9);  // linear interpolation: 5 + 0.7 * (6 - 5)
  EXPECT_NEAR(s.max, 6.0, 1e-9);
  EXPECT_NEAR(timer.stats(Phase::forward).mean, 0.45, 1e-9);
  EXPECT_NEAR(timer.stats(Phase::other).mean, 4.05, 1e-9);
  EXPECT_EQ(timer.stats(Phase::data_wait).mean, 0.0);

  const std::string line = timer.summary();
  EXPECT_NE(line.find("step 4500ms p50 4500 p90 5700"), std::string::npos) << line;
  EXPECT_NE(line.find("forward 450ms 10%"), std::string::npos) << line;
  EXPECT_NE(line.find("other 4050ms 90%"), std::string::npos) << line;
  EXPECT_EQ(line.find("allreduce_total"), std::string::npos) << "no communication, no total: " << line;

  timer.reset_stats();
  EXPECT_EQ(timer.stats(Phase::step).count, 0u);
  EXPECT_EQ(timer.summary(), "");
}

TEST(RollingWindow, MeanAndQuantiles) {
  RollingWindow w(5);
  EXPECT_EQ(w.mean(), 0.0);
  EXPECT_EQ(w.quantile(0.9), 0.0);
  for (double v : {5.0, 1.0, 4.0, 2.0, 3.0}) w.push(v);
  EXPECT_DOUBLE_EQ(w.mean(), 3.0);
  EXPECT_DOUBLE_EQ(w.quantile(0.0), 1.0);
  EXPECT_DOUBLE_EQ(w.quantile(0.5), 3.0);
  EXPECT_DOUBLE_EQ(w.quantile(0.9), 4.6);
  EXPECT_DOUBLE_EQ(w.quantile(1.0), 5.0);
  w.push(100.0);  // evicts the oldest (5)
  EXPECT_EQ(w.size(), 5u);
  EXPECT_DOUBLE_EQ(w.mean(), 22.0);
  EXPECT_DOUBLE_EQ(w.max(), 100.0);
}

TEST(StepTimer, MisuseIsAnError) {
  FakeTime t;
  StepTimer timer = fake_timer(t);
  EXPECT_THROW(timer.begin(Phase::forward), std::logic_error);  // no step
  EXPECT_THROW(timer.end_step(), std::logic_error);
  timer.begin_step();
  EXPECT_THROW(timer.begin_step(), std::logic_error);
  EXPECT_THROW(timer.begin(Phase::step), std::logic_error);
  EXPECT_THROW(timer.begin(Phase::other), std::logic_error);
  EXPECT_THROW(timer.end(Phase::forward), std::logic_error);  // not open
  timer.begin(Phase::forward);
  EXPECT_THROW(timer.begin(Phase::forward), std::logic_error);
  try {
    timer.end_step();
    FAIL() << "end_step with an open phase";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("forward"), std::string::npos) << e.what();
  }
}

TEST(StepTimer, SteadyClockMeasuresRealTime) {
  StepTimer timer;  // SteadyPhaseClock
  for (int i = 0; i < 3; ++i) {
    timer.begin_step();
    timer.begin(Phase::forward);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    timer.end(Phase::forward);
    const StepTimes r = *timer.end_step();
    EXPECT_EQ(r.step, i + 1);
    EXPECT_GE(r[Phase::forward], 0.004);
    EXPECT_LT(r[Phase::forward], 1.0);
    EXPECT_GE(r[Phase::step], r[Phase::forward]);
    EXPECT_GE(r[Phase::other], 0.0);
  }
}

TEST(StepTimer, PhaseNamesAreDistinctLabels) {
  std::set<std::string> names;
  for (Phase p : kAllPhases) names.insert(std::string(phase_name(p)));
  EXPECT_EQ(names.size(), kNumPhases);
  EXPECT_EQ(phase_name(Phase::allreduce_exposed), "allreduce_exposed");
  EXPECT_EQ(phase_name(Phase::data_wait), "data_wait");
}

}  // namespace
}  // namespace trainer
