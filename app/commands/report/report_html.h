#pragma once
// report.html: one self-contained page (inline SVG and CSS, one small inline script, nothing fetched)
// for one or several runs read by app/commands/report/report_run.h. Runs overlay on every chart, one colour
// per run.
#include <string>
#include <vector>

#include "app/commands/report/report_run.h"

namespace trainer {

// The page. Every series' SVG element carries data-series="r<run index>:<curve>" (the step phases:
// "r<i>:phases:<phase>"); the inline script writes the number of series that the browser drew with a
// non-empty box into <body data-drawn-series="N">, and the number the page holds into
// data-expected-series, so a headless browser can check the page.
std::string report_html(const std::vector<ReportRun>& runs);

// The step-phase shares per window of steps: the x (first step of each window), the window's end and,
// per phase (data_wait, h2d, forward, backward, allreduce_exposed, optimizer, other), its share of the
// step time. Windows hold ceil(steps / max_windows) steps.
struct PhaseWindows {
  std::vector<double> x;
  double x_end = 0;
  std::vector<std::pair<std::string, std::vector<double>>> shares;
};
PhaseWindows phase_windows(const ReportRun& run, size_t max_windows = 60);

}  // namespace trainer
