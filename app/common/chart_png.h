#pragma once
// A tiny line-chart rasteriser for `trainer bench`'s speedup.png: panels with axes, grid, tick labels
// (a 3x5 pixel font, scaled), reference lines and data series with points, encoded as PNG by libspng.
#include <cstdint>
#include <string>
#include <vector>

namespace trainer {

struct ChartSeries {
  std::vector<double> x, y;
  uint8_t r = 0, g = 0, b = 0;
  bool dashed = false;  // reference lines (ideal speedup, 100% efficiency)
  bool points = true;
};

struct ChartPanel {
  std::string title;  // lower-case letters, digits, spaces, '.', '%', '/' only (the font has no more)
  std::string x_label;
  double x_max = 1.0, y_max = 1.0;  // axes start at 0
  bool integer_x = true;            // x ticks at whole numbers only (process counts)
  std::vector<ChartSeries> series;
};

// Panels side by side, each panel_width x height pixels, RGB. Returns the PNG file's bytes.
std::string render_chart_png(const std::vector<ChartPanel>& panels, int panel_width = 480, int height = 360);

}  // namespace trainer
