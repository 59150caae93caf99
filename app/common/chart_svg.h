#pragma once
// Charts as inline SVG text, for `trainer report` (report.html) and `trainer bench` (speedup.svg): a
// title, axes with labels and ticks at round numbers, a grid, a legend and text of at least 12px. Each
// series' line or marker carries data-series="<id>" so a test (or a reader's browser tools) can count
// what was drawn. No script, no external font: the files open offline.
#include <cmath>
#include <string>
#include <vector>

namespace trainer {

// One line of a line chart. A series of a single point is drawn as a marker with its value written
// beside it (a lone dot says nothing).
struct SvgSeries {
  std::string name{};  // legend text
  std::string id{};    // data-series attribute: which run or curve this is
  std::vector<double> x{}, y{};
  std::vector<double> y_low{}, y_high{};  // optional, one per point: an interval drawn as an error bar
  std::string colour = "#1f77b4";         // any CSS colour
  bool dashed = false;                    // reference lines (ideal speedup) and secondary curves
  bool markers = false;                   // a circle at every point
};

// A point that has no value to plot (a bench run that diverged or never reached its target): a cross on
// the x axis with its reason.
struct SvgFlag {
  double x = 0;
  std::string text{};
  std::string colour = "#d62728";
};

struct SvgChart {
  std::string title{}, x_label{}, y_label{};  // labels carry their units: "step", "loss", "images/s"
  std::vector<SvgSeries> series{};
  std::vector<SvgFlag> flags{};
  bool y_from_zero = false;  // start the y axis at 0 (throughput, speedup) rather than at the data
  bool integer_x = false;    // x ticks at whole numbers only (epochs, process counts)
  double y_cap = NAN;        // the y axis never passes this (100 for accuracies in %)
  int width = 660, plot_height = 250;
};

// Stacked shares (0..1) of a whole over x: the step-phase breakdown. Layers stack in the order given.
struct SvgStackLayer {
  std::string name{};
  std::vector<double> share{};  // one per x
  std::string colour{};
};
struct SvgStackedChart {
  std::string title{}, x_label{}, y_label{}, id{};  // id: the data-series prefix ("<id>:<layer name>")
  std::vector<double> x{};                          // the start of each window; the last extends to x_end
  double x_end = 0;
  std::vector<SvgStackLayer> layers{};
  int width = 660, plot_height = 210;
};

std::string line_chart_svg(const SvgChart& chart);
std::string stacked_chart_svg(const SvgStackedChart& chart);

// Round tick values covering [lo, hi]: about `target` of them at 1, 2, 2.5 or 5 times a power of ten
// (whole numbers only when integer).
std::vector<double> round_ticks(double lo, double hi, int target, bool integer);
// A tick label: "0.25", "1200", "12k", "1.5M"; step is the tick spacing (it sets the decimals).
std::string tick_label(double v, double step);
// Text made safe inside SVG/HTML elements and attribute values.
std::string xml_escape(const std::string& text);
// The colour of the k-th run or curve: distinct hues that read on white.
const char* series_colour(size_t k);

}  // namespace trainer
