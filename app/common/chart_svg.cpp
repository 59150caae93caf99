#include "app/common/chart_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "app/common/format.h"

namespace trainer {
namespace {

// Layout in CSS pixels. Text sizes: 13px ticks and legend, 14px axis labels, 16px titles (>= 12px so a
// screenshot or a projector stays readable).
constexpr int kLeft = 78, kRight = 24, kTop = 40, kBottom = 52;
constexpr int kLegendRow = 22;
constexpr double kCharWidth = 7.4;  // an average 13px sans-serif character, for laying out the legend

struct Range {
  double lo = std::numeric_limits<double>::infinity(), hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    if (!std::isfinite(v)) return;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  bool empty() const { return lo > hi; }
};

// Ticks and the axis span they define: the axis ends on its first and last tick.
struct Axis {
  std::vector<double> ticks;
  double lo = 0, hi = 1, step = 1;
};

Axis make_axis(Range r, bool from_zero, bool integer) {
  if (r.empty()) r = {0, 1};
  if (from_zero) r.lo = std::min(r.lo, 0.0);
  if (r.hi - r.lo < 1e-12 * std::max(1.0, std::abs(r.hi))) {
    // A flat series: give it room around its value.
    const double pad = r.hi == 0 ? 1 : std::abs(r.hi) * 0.1;
    r.hi += pad;
    if (!(from_zero && r.lo == 0)) r.lo -= pad;
  }
  Axis a;
  a.ticks = round_ticks(r.lo, r.hi, 5, integer);
  a.lo = a.ticks.front();
  a.hi = a.ticks.back();
  a.step = a.ticks.size() > 1 ? a.ticks[1] - a.ticks[0] : 1;
  return a;
}

std::string num(double v) { return fmt("%.1f", v); }

// Lays legend entries out left to right, wrapping at the chart's width. Returns the rows' SVG and sets
// rows to how many it took.
// What stands before a legend entry's text: the series' line, a filled square (stacked layers) or the
// cross that marks points without a value.
enum class Swatch { line, dashed, block, cross };
struct LegendEntry {
  std::string name, colour;
  Swatch swatch = Swatch::line;
};
std::string legend_svg(const std::vector<LegendEntry>& entries, int width, int y0, int& rows) {
  std::string out = "<g class=\"legend\" font-size=\"13\">";
  double x = kLeft;
  rows = entries.empty() ? 0 : 1;
  for (const LegendEntry& e : entries) {
    const double w = 34 + kCharWidth * static_cast<double>(e.name.size()) + 18;
    if (x + w > width - kRight && x > kLeft) {
      x = kLeft;
      ++rows;
    }
    const double y = y0 + (rows - 1) * kLegendRow;
    if (e.swatch == Swatch::block)
      out += fmt("<rect x=\"%.1f\" y=\"%.1f\" width=\"24\" height=\"12\" fill=\"%s\"/>", x, y - 10,
                 e.colour.c_str());
    else if (e.swatch == Swatch::cross)
      out += fmt("<path d=\"M%.1f %.1fl10 10m0 -10l-10 10\" stroke=\"%s\" stroke-width=\"3\"/>", x + 7, y - 9,
                 e.colour.c_str());
    else
      out += fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"3\"%s/>",
                 x, y - 4, x + 24, y - 4, e.colour.c_str(),
                 e.swatch == Swatch::dashed ? " stroke-dasharray=\"6 4\"" : "");
    out += fmt("<text x=\"%.1f\" y=\"%.1f\">", x + 30, y) + xml_escape(e.name) + "</text>";
    x += w;
  }
  return out + "</g>";
}

// Title, plot frame, grid, ticks and axis labels.
std::string frame_svg(const std::string& title, const std::string& x_label, const std::string& y_label,
                      int width, int plot_height, const Axis& xa, const Axis& ya, bool y_percent) {
  const int plot_w = width - kLeft - kRight;
  std::string out;
  out += "<text x=\"" + num(width / 2.0) +
         "\" y=\"24\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\">" + xml_escape(title) +
         "</text>";
  out += fmt("<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#fff\" stroke=\"#888\"/>", kLeft,
             kTop, plot_w, plot_height);
  out += "<g font-size=\"13\" fill=\"#333\">";
  for (double t : xa.ticks) {
    const double x = kLeft + (t - xa.lo) / (xa.hi - xa.lo) * plot_w;
    out += fmt("<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#e3e3e3\"/>", x, kTop, x,
               kTop + plot_height);
    out += fmt("<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">", x, kTop + plot_height + 18) +
           tick_label(t, xa.step) + "</text>";
  }
  for (double t : ya.ticks) {
    const double y = kTop + plot_height - (t - ya.lo) / (ya.hi - ya.lo) * plot_height;
    out += fmt("<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#e3e3e3\"/>", kLeft, y,
               kLeft + plot_w, y);
    out += fmt("<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">", kLeft - 6, y + 4.5) +
           (y_percent ? tick_label(100 * t, 100 * ya.step) + "%" : tick_label(t, ya.step)) + "</text>";
  }
  out += "</g>";
  out += fmt("<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" font-size=\"14\">", kLeft + plot_w / 2.0,
             kTop + plot_height + 40) +
         xml_escape(x_label) + "</text>";
  out += fmt("<text transform=\"translate(18 %.1f) rotate(-90)\" text-anchor=\"middle\" font-size=\"14\">",
             kTop + plot_height / 2.0) +
         xml_escape(y_label) + "</text>";
  return out;
}

std::string svg_open(int width, int height, const std::string& title) {
  return fmt("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" ",
             width, height, width, height) +
         "role=\"img\" aria-label=\"" + xml_escape(title) +
         "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">";
}

// In place of ticks and lines while a run has not written a figure yet (or never will: no evaluation).
std::string no_data_svg(int width, int plot_height) {
  return fmt("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"14\" fill=\"#666\">",
             kLeft + (width - kLeft - kRight) / 2.0, kTop + plot_height / 2.0) +
         "no data yet</text>";
}

std::string value_text(double v) {
  if (std::abs(v) >= 1000) return fmt("%.0f", v);
  return fmt("%.3g", v);
}

// Data units to SVG pixels inside the plot frame.
struct PlotScale {
  Axis xa, ya;
  int plot_w = 0, plot_height = 0;
  double px(double x) const { return kLeft + (x - xa.lo) / (xa.hi - xa.lo) * plot_w; }
  double py(double y) const { return kTop + plot_height - (y - ya.lo) / (ya.hi - ya.lo) * plot_height; }
};

PlotScale line_chart_scale(const SvgChart& c) {
  Range xr, yr;
  for (const SvgSeries& s : c.series) {
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.y[i])) continue;
      xr.add(s.x[i]);
      yr.add(s.y[i]);
      if (i < s.y_low.size()) yr.add(s.y_low[i]);
      if (i < s.y_high.size()) yr.add(s.y_high[i]);
    }
  }
  for (const SvgFlag& f : c.flags) xr.add(f.x);
  if (!c.flags.empty() && yr.empty()) yr = {0, 1};
  // Whole-number x (epochs, processes): room after the last one, so its marker and bar clear the frame.
  if (c.integer_x && !xr.empty()) xr.hi += 0.04 * std::max(xr.hi - std::min(xr.lo, 0.0), 1.0);
  const Axis xa = make_axis(xr, c.integer_x && xr.lo >= 0 && xr.lo <= 1, c.integer_x);
  // Headroom above the highest point, so that a marker and its value label clear the frame.
  if (!yr.empty()) yr.hi += 0.06 * std::max(yr.hi - std::min(yr.lo, c.y_from_zero ? 0.0 : yr.lo), 1e-12);
  if (!yr.empty() && std::isfinite(c.y_cap) && yr.hi > c.y_cap) yr.hi = std::max(c.y_cap, yr.lo);
  const Axis ya = make_axis(yr, c.y_from_zero, false);
  return {xa, ya, c.width - kLeft - kRight, c.plot_height};
}

std::vector<LegendEntry> line_chart_legend(const SvgChart& c) {
  std::vector<LegendEntry> legend;
  for (const SvgSeries& s : c.series)
    legend.push_back({s.name, s.colour, s.dashed ? Swatch::dashed : Swatch::line});
  if (!c.flags.empty()) legend.push_back({"no value (the reason beside it)", "#555", Swatch::cross});
  return legend;
}

std::string error_bars_svg(const SvgSeries& s, const PlotScale& p) {
  std::string out;
  for (size_t i = 0; i < s.x.size() && i < s.y_low.size() && i < s.y_high.size(); ++i) {
    if (!std::isfinite(s.y_low[i]) || !std::isfinite(s.y_high[i]) || s.y_high[i] <= s.y_low[i]) continue;
    const double x = p.px(s.x[i]), lo = p.py(s.y_low[i]), hi = p.py(s.y_high[i]);
    out +=
        fmt("<path class=\"interval\" d=\"M%.1f %.1fV%.1fM%.1f %.1fH%.1fM%.1f %.1fH%.1f\" stroke=\"%s\" "
            "stroke-width=\"2\" fill=\"none\"/>",
            x, lo, hi, x - 6, lo, x + 6, x - 6, hi, x + 6, s.colour.c_str());
  }
  return out;
}

std::string series_svg(const SvgSeries& s, const PlotScale& p) {
  std::string out = "<g class=\"series\" data-series=\"" + xml_escape(s.id) + "\">";
  std::vector<std::pair<double, double>> pts;
  for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
    if (std::isfinite(s.x[i]) && std::isfinite(s.y[i])) pts.push_back({s.x[i], s.y[i]});
  // Error bars first, so the line and markers sit on top.
  out += error_bars_svg(s, p);
  if (pts.size() >= 2) {
    out += "<polyline fill=\"none\" stroke=\"" + s.colour +
           "\" stroke-width=\"2\" stroke-linejoin=\"round\"" + (s.dashed ? " stroke-dasharray=\"6 4\"" : "") +
           " points=\"";
    for (const auto& [x, y] : pts) out += num(p.px(x)) + "," + num(p.py(y)) + " ";
    out += "\"/>";
  }
  const bool single = pts.size() == 1;
  if (s.markers || single)
    for (const auto& [x, y] : pts)
      out += fmt("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%d\" fill=\"%s\" stroke=\"#fff\"/>", p.px(x), p.py(y),
                 single ? 6 : 4, s.colour.c_str());
  if (single)
    out += fmt("<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\" fill=\"%s\">", p.px(pts[0].first) + 10,
               p.py(pts[0].second) - 8, s.colour.c_str()) +
           value_text(pts[0].second) + "</text>";
  return out + "</g>";
}

std::string flag_svg(const SvgFlag& f, const PlotScale& p) {
  const double x = p.px(f.x), y = kTop + p.plot_height - 10.0;
  return fmt("<g class=\"flag\" data-series=\"flag\"><path d=\"M%.1f %.1fl10 10m0 -10l-10 10\" stroke=\"%s\" "
             "stroke-width=\"3\"/>",
             x - 5, y - 5, f.colour.c_str()) +
         fmt("<text transform=\"translate(%.1f %.1f) rotate(-90)\" font-size=\"13\" fill=\"%s\">", x + 4.5,
             y - 10, f.colour.c_str()) +
         xml_escape(f.text) + "</text></g>";
}

}  // namespace

std::vector<double> round_ticks(double lo, double hi, int target, bool integer) {
  if (!(hi > lo)) hi = lo + 1;
  const double raw = (hi - lo) / std::max(1, target);
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10 * power;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * power >= raw) {
      step = m * power;
      break;
    }
  if (integer) step = std::max(1.0, std::round(step));
  const double first = std::floor(lo / step + 1e-9) * step;
  const double last = std::ceil(hi / step - 1e-9) * step;
  std::vector<double> ticks;
  for (int i = 0; first + i * step <= last + step * 1e-6 && i < 100; ++i) {
    // Rounded to 12 digits: 3 x 0.2 is 0.6, not 0.6000000000000001.
    const double t = std::strtod(fmt("%.12g", first + i * step).c_str(), nullptr);
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  }
  if (ticks.size() < 2) ticks.push_back(first + step);
  return ticks;
}

std::string tick_label(double v, double step) {
  const double a = std::abs(step);
  if (a >= 1000 && std::abs(v) >= 1000) {
    const bool mega = std::abs(v) >= 1e6 && a >= 1e5;
    const double unit = mega ? 1e6 : 1e3;
    const double s = a / unit;
    const int decimals =
        s >= 1 ? (std::fmod(s, 1.0) == 0 ? 0 : 1) : static_cast<int>(std::ceil(-std::log10(s)));
    return fmt("%.*f", decimals, v / unit) + (mega ? "M" : "k");
  }
  int decimals = 0;
  if (a < 1) decimals = static_cast<int>(std::ceil(-std::log10(a) - 1e-9));
  // 0.25, 2.5: one more decimal than the power of ten says.
  if (std::abs(std::round(a * std::pow(10.0, decimals)) - a * std::pow(10.0, decimals)) > 1e-6) ++decimals;
  return fmt("%.*f", decimals, v);
}

std::string xml_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

const char* series_colour(size_t k) {
  static const char* colours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                  "#ff7f0e", "#17becf", "#8c564b", "#e377c2"};
  return colours[k % (sizeof colours / sizeof colours[0])];
}

std::string line_chart_svg(const SvgChart& c) {
  const PlotScale scale = line_chart_scale(c);
  int rows = 0;
  const int legend_y = kTop + c.plot_height + kBottom + 16;
  const std::string legend_part = legend_svg(line_chart_legend(c), c.width, legend_y, rows);
  const int height = legend_y + (rows - 1) * kLegendRow + 12;

  std::string out = svg_open(c.width, height, c.title);
  const bool empty = c.series.empty() && c.flags.empty();
  out += frame_svg(c.title, c.x_label, c.y_label, c.width, c.plot_height, empty ? Axis{} : scale.xa,
                   empty ? Axis{} : scale.ya, false);
  if (empty) out += no_data_svg(c.width, c.plot_height);
  for (const SvgSeries& s : c.series) out += series_svg(s, scale);
  for (const SvgFlag& f : c.flags) out += flag_svg(f, scale);
  out += legend_part;
  return out + "</svg>";
}

std::string stacked_chart_svg(const SvgStackedChart& c) {
  Range xr;
  for (double x : c.x) xr.add(x);
  xr.add(c.x_end);
  const Axis xa = make_axis(xr, false, true);
  Axis ya;
  ya.ticks = {0, 0.2, 0.4, 0.6, 0.8, 1.0};
  ya.lo = 0;
  ya.hi = 1;
  ya.step = 0.2;
  const int plot_w = c.width - kLeft - kRight;
  auto px = [&](double x) { return kLeft + (x - xa.lo) / (xa.hi - xa.lo) * plot_w; };
  auto py = [&](double y) { return kTop + c.plot_height - y * c.plot_height; };

  std::vector<LegendEntry> legend;
  for (const SvgStackLayer& l : c.layers) legend.push_back({l.name, l.colour, Swatch::block});
  int rows = 0;
  const int legend_y = kTop + c.plot_height + kBottom + 16;
  const std::string legend_part = legend_svg(legend, c.width, legend_y, rows);
  const int height = legend_y + (rows - 1) * kLegendRow + 12;

  std::string out = svg_open(c.width, height, c.title);
  out +=
      frame_svg(c.title, c.x_label, c.y_label, c.width, c.plot_height, c.x.empty() ? Axis{} : xa, ya, true);
  if (c.x.empty()) out += no_data_svg(c.width, c.plot_height);
  std::vector<double> base(c.x.size(), 0.0);
  for (const SvgStackLayer& l : c.layers) {
    // A step-shaped band: along the layer's top left to right, back along its bottom.
    std::string top, bottom;
    for (size_t i = 0; i < c.x.size(); ++i) {
      const double x0 = px(c.x[i]), x1 = px(i + 1 < c.x.size() ? c.x[i + 1] : c.x_end);
      const double share = i < l.share.size() && std::isfinite(l.share[i]) ? std::max(0.0, l.share[i]) : 0.0;
      const double lo = std::min(base[i], 1.0), hi = std::min(base[i] + share, 1.0);
      top += num(x0) + "," + num(py(hi)) + " " + num(x1) + "," + num(py(hi)) + " ";
      bottom = num(x1) + "," + num(py(lo)) + " " + num(x0) + "," + num(py(lo)) + " " + bottom;
      base[i] += share;
    }
    out += "<polygon class=\"series\" data-series=\"" + xml_escape(c.id + ":" + l.name) + "\" fill=\"" +
           l.colour + "\" stroke=\"none\" points=\"" + top + bottom + "\"/>";
  }
  out += legend_part;
  return out + "</svg>";
}

}  // namespace trainer
