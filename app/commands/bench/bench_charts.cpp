#include "app/commands/bench/bench_charts.h"

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "app/common/chart_svg.h"
#include "app/common/format.h"

namespace trainer::bench {
namespace {

constexpr int kPanelWidth = 540;

struct Curve {
  std::string precision;
  int batch;
  std::vector<const BenchChartPoint*> points;  // by process count
};

std::vector<Curve> curves_of(const std::vector<BenchChartPoint>& points) {
  std::vector<Curve> curves;
  for (const BenchChartPoint& p : points) {
    auto it = std::find_if(curves.begin(), curves.end(),
                           [&](const Curve& c) { return c.precision == p.precision && c.batch == p.batch; });
    if (it == curves.end()) it = curves.insert(curves.end(), Curve{p.precision, p.batch, {}});
    it->points.push_back(&p);
  }
  for (Curve& c : curves)
    std::sort(c.points.begin(), c.points.end(),
              [](const BenchChartPoint* a, const BenchChartPoint* b) { return a->procs < b->procs; });
  return curves;
}

std::string curve_name(const Curve& c) {
  return c.precision + ", batch " + std::to_string(c.batch) + "/rank";
}
std::string curve_id(const Curve& c) { return c.precision + "-b" + std::to_string(c.batch); }

// One panel: value_of(point) per curve, flags where a point has no value (flag_of says why, "" = no flag).
template <class Value, class Flag>
SvgChart panel(const std::vector<Curve>& curves, const std::string& title, const std::string& y_label,
               const std::string& id_suffix, Value value_of, Flag flag_of) {
  SvgChart c{
      .title = title, .x_label = "processes", .y_label = y_label, .y_from_zero = true, .integer_x = true};
  c.width = kPanelWidth;
  for (size_t k = 0; k < curves.size(); ++k) {
    SvgSeries s{.name = curve_name(curves[k]), .id = curve_id(curves[k]) + ":" + id_suffix};
    s.colour = series_colour(k);
    s.markers = true;
    for (const BenchChartPoint* p : curves[k].points) {
      const double v = value_of(*p);
      if (std::isfinite(v)) {
        s.x.push_back(p->procs);
        s.y.push_back(v);
      } else if (const std::string why = flag_of(*p); !why.empty()) {
        // With several curves the flag names its own: an all-flagged curve has no legend line.
        c.flags.push_back({static_cast<double>(p->procs),
                           curves.size() > 1 ? curve_name(curves[k]) + ": " + why : why, series_colour(k)});
      }
    }
    if (!s.x.empty()) c.series.push_back(std::move(s));
  }
  return c;
}

std::string flag_of_speedup(const BenchChartPoint& p) {
  if (!p.flag.empty()) return p.flag;
  return std::isfinite(p.value) ? "baseline not reached" : "";
}

int svg_height(const std::string& svg) {
  const size_t at = svg.find("height=\"");
  return at == std::string::npos ? 0 : std::atoi(svg.c_str() + at + 8);
}

}  // namespace

std::string bench_chart_svg(const std::vector<BenchChartPoint>& points, int max_procs, bool to_accuracy) {
  const std::vector<Curve> curves = curves_of(points);
  SvgChart sp = panel(
      curves, to_accuracy ? "Speedup in time to accuracy" : "Speedup", "speedup (x over fewest processes)",
      "speedup", [](const BenchChartPoint& p) { return p.speedup; }, flag_of_speedup);
  sp.series.insert(sp.series.begin(), SvgSeries{.name = "ideal (linear)",
                                                .id = "ideal:speedup",
                                                .x = {1, static_cast<double>(max_procs)},
                                                .y = {1, static_cast<double>(max_procs)},
                                                .colour = "#888",
                                                .dashed = true});
  SvgChart ef = panel(
      curves, "Scaling efficiency", "efficiency (% of linear)", "efficiency",
      [](const BenchChartPoint& p) { return 100 * p.efficiency; }, flag_of_speedup);
  ef.series.insert(ef.series.begin(), SvgSeries{.name = "100%",
                                                .id = "ideal:efficiency",
                                                .x = {1, static_cast<double>(max_procs)},
                                                .y = {100, 100},
                                                .colour = "#888",
                                                .dashed = true});
  SvgChart th = panel(
      curves, to_accuracy ? "Time to accuracy" : "Throughput",
      to_accuracy ? "training seconds to target (95% interval)" : "images/s (mean, 95% interval)",
      to_accuracy ? "seconds" : "img_per_s", [](const BenchChartPoint& p) { return p.value; },
      [](const BenchChartPoint& p) { return p.flag; });
  for (SvgSeries& s : th.series)
    for (const Curve& c : curves)
      if (s.id == curve_id(c) + ":" + (to_accuracy ? "seconds" : "img_per_s"))
        for (const BenchChartPoint* p : c.points)
          if (std::isfinite(p->value)) {
            const double half = std::isfinite(p->ci95) ? p->ci95 : 0.0;
            s.y_low.push_back(std::max(0.0, p->value - half));  // a few noisy repeats: t reaches below 0
            s.y_high.push_back(p->value + half);
          }
  const std::string panels[] = {line_chart_svg(sp), line_chart_svg(ef), line_chart_svg(th)};
  int height = 0;
  for (const std::string& p : panels) height = std::max(height, svg_height(p));
  const int width = 3 * kPanelWidth;
  std::string out =
      fmt("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">",
          width, height, width, height) +
      fmt("<rect width=\"%d\" height=\"%d\" fill=\"#fff\"/>", width, height);
  for (int i = 0; i < 3; ++i)
    out += fmt("<g transform=\"translate(%d 0)\">", i * kPanelWidth) + panels[i] + "</g>";
  return out + "</svg>\n";
}

void write_bench_chart_files(const std::filesystem::path& out, int max_procs, bool to_accuracy,
                             const std::vector<BenchChartPoint>& points) {
  std::ofstream(out / "speedup.svg") << bench_chart_svg(points, max_procs, to_accuracy);
  // speedup.png: the PNG panels (speedup, efficiency) for viewers without SVG.
  std::vector<SpeedupCurve> png_curves;
  for (const Curve& c : curves_of(points)) {
    SpeedupCurve s;
    for (const BenchChartPoint* p : c.points)
      if (!std::isnan(p->speedup)) {
        s.procs.push_back(p->procs);
        s.speedup.push_back(p->speedup);
        s.efficiency.push_back(p->efficiency);
      }
    png_curves.push_back(s);
  }
  write_chart_file(out / "speedup.png", speedup_chart_png(static_cast<double>(max_procs), png_curves));
  std::printf("\nwrote %s, %s, %s, %s\n", (out / "bench.csv").c_str(), (out / "bench.json").c_str(),
              (out / "speedup.svg").c_str(), (out / "speedup.png").c_str());
}

}  // namespace trainer::bench
