#include "app/commands/report/report_html.h"

#include <algorithm>
#include <cmath>
#include <ctime>

#include "app/common/chart_svg.h"
#include "app/common/format.h"

namespace trainer {
namespace {

// More points than the chart has pixels only make the file big: longer curves are averaged in buckets.
constexpr size_t kMaxCurvePoints = 800;

struct Curve {
  std::vector<double> x, y;
};

Curve bucket_means(const std::vector<double>& x, const std::vector<double>& y) {
  const size_t n = std::min(x.size(), y.size());
  const size_t per = std::max<size_t>(1, (n + kMaxCurvePoints - 1) / kMaxCurvePoints);
  Curve c;
  for (size_t i = 0; i < n; i += per) {
    double sx = 0, sy = 0;
    size_t k = 0;
    for (size_t j = i; j < std::min(n, i + per); ++j)
      if (std::isfinite(y[j])) {
        sx += x[j];
        sy += y[j];
        ++k;
      }
    if (k > 0) {
      c.x.push_back(sx / k);
      c.y.push_back(sy / k);
    }
  }
  return c;
}

std::string run_id(size_t k, const std::string& curve) { return "r" + std::to_string(k) + ":" + curve; }

const std::vector<double>* column(const ReportRun& r, const std::string& name) {
  const auto it = r.step_times.find(name);
  return it == r.step_times.end() ? nullptr : &it->second;
}

// One per-epoch figure of a run against `x_of` (the epoch's step, or the epoch itself).
SvgSeries epoch_series(const ReportRun& r, double ReportEpoch::*field, bool x_is_step, double scale) {
  SvgSeries s;
  for (const ReportEpoch& e : r.epochs) {
    const double x = x_is_step ? e.step : e.epoch;
    if (std::isfinite(x) && std::isfinite(e.*field)) {
      s.x.push_back(x);
      s.y.push_back(scale * (e.*field));
    }
  }
  return s;
}

SvgSeries named(SvgSeries s, const std::string& name, const std::string& id, const char* colour, bool dashed,
                bool markers) {
  s.name = name;
  s.id = id;
  s.colour = colour;
  s.dashed = dashed;
  s.markers = markers;
  return s;
}

void add_if_drawn(SvgChart& chart, SvgSeries s) {
  if (!s.x.empty()) chart.series.push_back(std::move(s));
}

std::string loss_chart(const std::vector<ReportRun>& runs, const std::string& x_label) {
  SvgChart c{.title = "Loss", .x_label = x_label, .y_label = "cross-entropy loss (nats)"};
  for (size_t k = 0; k < runs.size(); ++k) {
    const ReportRun& r = runs[k];
    const Curve train = bucket_means(r.step, r.loss);
    SvgSeries s;
    s.x = train.x;
    s.y = train.y;
    add_if_drawn(c,
                 named(s, r.name + " train (per step)", run_id(k, "loss"), series_colour(k), false, false));
    if (r.step.empty())  // no per-step losses: the epochs' train loss instead
      add_if_drawn(c, named(epoch_series(r, &ReportEpoch::train_loss, true, 1), r.name + " train (per epoch)",
                            run_id(k, "train_loss"), series_colour(k), false, true));
    add_if_drawn(c, named(epoch_series(r, &ReportEpoch::eval_loss, true, 1), r.name + " test (per epoch)",
                          run_id(k, "eval_loss"), series_colour(k), true, true));
  }
  return line_chart_svg(c);
}

// Only when some run's train_steps.csv has wall_time: runs at different speeds (1 rank vs 2) compare
// by how soon they get somewhere, not by step.
std::string wall_time_loss_chart(const std::vector<ReportRun>& runs) {
  SvgChart c{.title = "Loss over wall-clock time",
             .x_label = "seconds since the run's first step",
             .y_label = "cross-entropy loss (nats)"};
  for (size_t k = 0; k < runs.size(); ++k) {
    const ReportRun& r = runs[k];
    if (r.wall_time.empty()) continue;
    std::vector<double> seconds;
    for (double t : r.wall_time) seconds.push_back(t - r.wall_time.front());
    const Curve train = bucket_means(seconds, r.loss);
    SvgSeries s;
    s.x = train.x;
    s.y = train.y;
    add_if_drawn(
        c, named(s, r.name + " train (per step)", run_id(k, "loss_wall"), series_colour(k), false, false));
  }
  return c.series.empty() ? "" : line_chart_svg(c);
}

std::string accuracy_chart(const std::vector<ReportRun>& runs) {
  SvgChart c{.title = "Test accuracy",
             .x_label = "epoch",
             .y_label = "accuracy (%)",
             .integer_x = true,
             .y_cap = 100};
  for (size_t k = 0; k < runs.size(); ++k) {
    const ReportRun& r = runs[k];
    add_if_drawn(c, named(epoch_series(r, &ReportEpoch::top1, false, 100), r.name + " top-1",
                          run_id(k, "top1"), series_colour(k), false, true));
    add_if_drawn(c, named(epoch_series(r, &ReportEpoch::top5, false, 100), r.name + " top-5",
                          run_id(k, "top5"), series_colour(k), true, true));
  }
  return line_chart_svg(c);
}

std::string lr_chart(const std::vector<ReportRun>& runs, const std::string& x_label) {
  SvgChart c{.title = "Learning rate", .x_label = x_label, .y_label = "learning rate", .y_from_zero = true};
  for (size_t k = 0; k < runs.size(); ++k) {
    const Curve lr = bucket_means(runs[k].step, runs[k].lr);
    SvgSeries s;
    s.x = lr.x;
    s.y = lr.y;
    add_if_drawn(c, named(s, runs[k].name, run_id(k, "lr"), series_colour(k), false, false));
  }
  return line_chart_svg(c);
}

// img/s per window of steps from step_times.csv (global batch / step time: training alone), and per epoch
// from the epoch lines (data loading and the epoch's ends included).
std::string throughput_chart(const std::vector<ReportRun>& runs, const std::string& x_label) {
  SvgChart c{.title = "Throughput", .x_label = x_label, .y_label = "images/s", .y_from_zero = true};
  for (size_t k = 0; k < runs.size(); ++k) {
    const ReportRun& r = runs[k];
    const std::vector<double>* steps = column(r, "step");
    const std::vector<double>* secs = column(r, "step_seconds");
    if (steps && secs && r.images_per_step > 0) {
      const size_t n = std::min(steps->size(), secs->size());
      const size_t per = std::max<size_t>(1, (n + 59) / 60);
      SvgSeries s;
      for (size_t i = 0; i < n; i += per) {
        double t = 0;
        size_t m = 0;
        for (size_t j = i; j < std::min(n, i + per); ++j, ++m) t += (*secs)[j];
        if (t > 0) {
          s.x.push_back((*steps)[i]);
          s.y.push_back(static_cast<double>(r.images_per_step) * m / t);
        }
      }
      add_if_drawn(c, named(s, r.name + " (step time, per window)", run_id(k, "throughput"), series_colour(k),
                            false, false));
    }
    add_if_drawn(c, named(epoch_series(r, &ReportEpoch::images_per_second, true, 1), r.name + " (per epoch)",
                          run_id(k, "throughput_epoch"), series_colour(k), true, true));
  }
  return line_chart_svg(c);
}

// Runs of different global batches (1 rank and 2) compare by images seen, not by optimizer step: the
// runs with their steps (train_steps.csv, step_times.csv, epoch ends) in images. Empty when the runs share
// one global batch, or one does not know its own.
std::vector<ReportRun> steps_as_images(const std::vector<ReportRun>& runs) {
  bool differ = false;
  for (const ReportRun& r : runs) {
    if (r.images_per_step <= 0) return {};
    differ = differ || r.images_per_step != runs.front().images_per_step;
  }
  if (!differ) return {};
  std::vector<ReportRun> out = runs;
  for (ReportRun& r : out) {
    const double g = static_cast<double>(r.images_per_step);
    for (double& x : r.step) x *= g;
    for (ReportEpoch& e : r.epochs) e.step *= g;
    if (const auto it = r.step_times.find("step"); it != r.step_times.end())
      for (double& x : it->second) x *= g;
  }
  return out;
}

struct PhaseStyle {
  const char* column;  // step_times.csv column, "" for the rest of the step
  const char* name;
  const char* colour;
};
const PhaseStyle kPhases[] = {{"data_wait_seconds", "data_wait", "#ff7f0e"},
                              {"h2d_seconds", "h2d", "#bcbd22"},
                              {"forward_seconds", "forward", "#1f77b4"},
                              {"backward_seconds", "backward", "#9467bd"},
                              {"allreduce_exposed_seconds", "allreduce (exposed)", "#d62728"},
                              {"optimizer_seconds", "optimizer", "#2ca02c"},
                              {"", "other", "#aaaaaa"}};

std::string phase_chart(const ReportRun& r, size_t k) {
  const PhaseWindows w = phase_windows(r);
  SvgStackedChart c{.title = "Step phases: " + r.name,
                    .x_label = "optimizer step (windows of steps)",
                    .y_label = "share of step time",
                    .id = "r" + std::to_string(k) + ":phases",
                    .x = w.x,
                    .x_end = w.x_end};
  for (const auto& [name, share] : w.shares)
    for (const PhaseStyle& p : kPhases)
      if (name == p.name) c.layers.push_back({name, share, p.colour});
  return stacked_chart_svg(c);
}

std::string summary_table(const std::vector<ReportRun>& runs) {
  std::vector<std::string> keys;
  for (const ReportRun& r : runs)
    for (const auto& [key, value] : r.summary)
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
  std::string out = "<table><thead><tr><th>summary.json</th>";
  for (size_t k = 0; k < runs.size(); ++k)
    out += fmt("<th><span class=\"swatch\" style=\"background:%s\"></span>", series_colour(k)) +
           xml_escape(runs[k].name) + "</th>";
  out += "</tr></thead><tbody>";
  auto row = [&](const std::string& key, auto value_of) {
    out += "<tr><th>" + xml_escape(key) + "</th>";
    for (const ReportRun& r : runs) out += "<td>" + xml_escape(value_of(r)) + "</td>";
    out += "</tr>";
  };
  for (const std::string& key : keys)
    row(key, [&](const ReportRun& r) {
      for (const auto& [k, v] : r.summary)
        if (k == key) return v;
      return std::string("-");
    });
  std::vector<std::string> config_keys;
  for (const ReportRun& r : runs)
    for (const auto& [key, value] : r.config)
      if (std::find(config_keys.begin(), config_keys.end(), key) == config_keys.end())
        config_keys.push_back(key);
  for (const std::string& key : config_keys)
    row("config " + key, [&](const ReportRun& r) {
      for (const auto& [k, v] : r.config)
        if (k == key) return v;
      return std::string("-");
    });
  row("per-epoch figures from",
      [](const ReportRun& r) { return r.epochs_source.empty() ? "-" : r.epochs_source; });
  row("images per step", [](const ReportRun& r) {
    return r.images_per_step > 0 ? std::to_string(r.images_per_step) : std::string("unknown");
  });
  return out + "</tbody></table>";
}

const char* kStyle =
    "body{font-family:'DejaVu Sans',Helvetica,Arial,sans-serif;font-size:15px;color:#222;margin:24px;}"
    "h1{font-size:22px;margin:0 0 6px 0}h2{font-size:18px;margin:28px 0 8px 0}"
    ".charts{display:flex;flex-wrap:wrap;gap:16px}.charts svg{background:#fafafa;border:1px solid #ddd}"
    "table{border-collapse:collapse;font-size:14px}th,td{border:1px solid #ccc;padding:4px "
    "10px;text-align:left}"
    "thead th{background:#f0f0f0}td{font-variant-numeric:tabular-nums}"
    ".swatch{display:inline-block;width:12px;height:12px;margin-right:6px;vertical-align:-1px}"
    ".notes{color:#555;font-size:14px}";

// Counts the series the browser laid out with a box (a line, area or marker it really drew), for the
// headless check in tests/app; it draws nothing and fetches nothing.
const char* kScript =
    "(function(){var all=document.querySelectorAll('[data-series]'),drawn=0;"
    "for(var i=0;i<all.length;i++){var b=all[i].getBBox();if(b.width>0||b.height>0)drawn++;}"
    "document.body.setAttribute('data-drawn-series',String(drawn));})();";

size_t count_series(const std::string& html) {
  size_t n = 0;
  for (size_t at = html.find("data-series=\""); at != std::string::npos;
       at = html.find("data-series=\"", at + 1))
    ++n;
  return n;
}

}  // namespace

PhaseWindows phase_windows(const ReportRun& r, size_t max_windows) {
  PhaseWindows w;
  const std::vector<double>* steps = column(r, "step");
  const std::vector<double>* total = column(r, "step_seconds");
  if (!steps || !total) return w;
  const size_t n = std::min(steps->size(), total->size());
  const size_t per = std::max<size_t>(1, (n + max_windows - 1) / max_windows);
  for (const PhaseStyle& p : kPhases) w.shares.push_back({p.name, {}});
  for (size_t i = 0; i < n; i += per) {
    const size_t end = std::min(n, i + per);
    double t = 0;
    for (size_t j = i; j < end; ++j) t += (*total)[j];
    if (!(t > 0)) continue;
    w.x.push_back((*steps)[i]);
    double named_share = 0;
    for (size_t p = 0; p + 1 < std::size(kPhases); ++p) {
      const std::vector<double>* c = column(r, kPhases[p].column);
      double s = 0;
      for (size_t j = i; c && j < end && j < c->size(); ++j) s += std::isfinite((*c)[j]) ? (*c)[j] : 0;
      w.shares[p].second.push_back(s / t);
      named_share += s / t;
    }
    w.shares.back().second.push_back(std::max(0.0, 1 - named_share));
    w.x_end = (*steps)[end - 1] + 1;
  }
  return w;
}

std::string report_html(const std::vector<ReportRun>& runs) {
  std::string names;
  for (const ReportRun& r : runs) names += (names.empty() ? "" : ", ") + r.name;
  std::string body;
  body += "<h1>Training report: " + xml_escape(names) + "</h1>";
  const std::time_t now = std::time(nullptr);
  char when[64];
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  body += "<p class=\"notes\">Written by <code>trainer report</code> at " + std::string(when) + " from ";
  for (size_t k = 0; k < runs.size(); ++k)
    body += (k ? ", " : "") + std::string("<code>") + xml_escape(runs[k].dir.string()) + "</code>";
  body += ". Per-step curves with more than 800 points are averaged in buckets.</p>";
  const std::vector<ReportRun> by_images = steps_as_images(runs);
  const std::vector<ReportRun>& curves = by_images.empty() ? runs : by_images;
  const std::string x_label =
      by_images.empty() ? "optimizer step" : "training images seen (steps x global batch)";
  if (!by_images.empty())
    body +=
        "<p class=\"notes\">The runs' global batches differ: step axes count training images instead.</p>";
  body += "<h2>Curves</h2><div class=\"charts\">" + loss_chart(curves, x_label) + accuracy_chart(runs) +
          lr_chart(curves, x_label) + throughput_chart(curves, x_label) + wall_time_loss_chart(runs) +
          "</div>";
  body +=
      "<h2>Where a step's time goes</h2><p class=\"notes\">Shares of rank 0's step time per window of "
      "steps (step_times.csv); allreduce (exposed) is the wait for the gradient all-reduce after "
      "backward; other is the rest of the step.</p><div class=\"charts\">";
  for (size_t k = 0; k < runs.size(); ++k) body += phase_chart(runs[k], k);
  body += "</div><h2>Summary</h2>" + summary_table(runs);
  std::string notes;
  for (const ReportRun& r : runs)
    for (const std::string& n : r.notes) notes += "<li>" + xml_escape(r.name + ": " + n) + "</li>";
  if (!notes.empty()) body += "<h2>Notes</h2><ul class=\"notes\">" + notes + "</ul>";
  return "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>trainer report: " +
         xml_escape(names) + "</title><style>" + kStyle + "</style></head>\n<body data-expected-series=\"" +
         std::to_string(count_series(body)) + "\">\n" + body + "\n<script>" + kScript +
         "</script>\n</body></html>\n";
}

}  // namespace trainer
