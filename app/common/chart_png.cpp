#include "app/common/chart_png.h"

#include <spng.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <stdexcept>

namespace trainer {
namespace {

// 3x5 glyphs, rows top to bottom, '#' = ink.
const std::map<char, std::array<const char*, 5>>& font() {
  static const std::map<char, std::array<const char*, 5>> f = {
      {'0', {"###", "#.#", "#.#", "#.#", "###"}}, {'1', {".#.", "##.", ".#.", ".#.", "###"}},
      {'2', {"###", "..#", "###", "#..", "###"}}, {'3', {"###", "..#", ".##", "..#", "###"}},
      {'4', {"#.#", "#.#", "###", "..#", "..#"}}, {'5', {"###", "#..", "###", "..#", "###"}},
      {'6', {"###", "#..", "###", "#.#", "###"}}, {'7', {"###", "..#", "..#", ".#.", ".#."}},
      {'8', {"###", "#.#", "###", "#.#", "###"}}, {'9', {"###", "#.#", "###", "..#", "###"}},
      {'.', {"...", "...", "...", "...", ".#."}}, {'%', {"#.#", "..#", ".#.", "#..", "#.#"}},
      {'/', {"..#", "..#", ".#.", "#..", "#.."}}, {' ', {"...", "...", "...", "...", "..."}},
      {'a', {"...", "##.", "..#", "###", "###"}}, {'b', {"#..", "#..", "###", "#.#", "###"}},
      {'c', {"...", "###", "#..", "#..", "###"}}, {'d', {"..#", "..#", "###", "#.#", "###"}},
      {'e', {"###", "#.#", "###", "#..", "###"}}, {'f', {".##", "#..", "###", "#..", "#.."}},
      {'g', {"###", "#.#", "###", "..#", "##."}}, {'i', {".#.", "...", ".#.", ".#.", ".#."}},
      {'l', {"#..", "#..", "#..", "#..", ".##"}}, {'m', {"...", "###", "###", "#.#", "#.#"}},
      {'n', {"...", "##.", "#.#", "#.#", "#.#"}}, {'o', {"...", "###", "#.#", "#.#", "###"}},
      {'p', {"###", "#.#", "###", "#..", "#.."}}, {'r', {"...", "###", "#..", "#..", "#.."}},
      {'s', {"###", "#..", "###", "..#", "###"}}, {'t', {"#..", "###", "#..", "#..", ".##"}},
      {'u', {"...", "#.#", "#.#", "#.#", "###"}}, {'y', {"#.#", "#.#", "###", "..#", "###"}},
      {'x', {"...", "#.#", ".#.", ".#.", "#.#"}}, {'v', {"...", "#.#", "#.#", "#.#", ".#."}},
      {'k', {"#..", "#.#", "##.", "#.#", "#.#"}}, {'h', {"#..", "#..", "###", "#.#", "#.#"}},
      {'w', {"...", "#.#", "#.#", "###", "###"}}, {'z', {"...", "###", ".#.", "#..", "###"}},
  };
  return f;
}

class Canvas {
 public:
  Canvas(int w, int h) : w_(w), h_(h), rgb_(static_cast<size_t>(w) * h * 3, 255) {}
  void pixel(int x, int y, uint8_t r, uint8_t g, uint8_t b) {
    if (x < 0 || y < 0 || x >= w_ || y >= h_) return;
    uint8_t* p = &rgb_[(static_cast<size_t>(y) * w_ + x) * 3];
    p[0] = r, p[1] = g, p[2] = b;
  }
  // A line `thick` pixels wide; dashed = 6 on, 4 off.
  void line(double x0, double y0, double x1, double y1, uint8_t r, uint8_t g, uint8_t b, int thick = 1,
            bool dashed = false) {
    const double len = std::hypot(x1 - x0, y1 - y0);
    const int n = std::max(1, static_cast<int>(std::ceil(len * 2)));
    for (int i = 0; i <= n; ++i) {
      const double t = static_cast<double>(i) / n;
      if (dashed && std::fmod(t * len, 10.0) >= 6.0) continue;
      const int cx = static_cast<int>(std::lround(x0 + t * (x1 - x0)));
      const int cy = static_cast<int>(std::lround(y0 + t * (y1 - y0)));
      for (int dy = -(thick - 1) / 2; dy <= thick / 2; ++dy)
        for (int dx = -(thick - 1) / 2; dx <= thick / 2; ++dx) pixel(cx + dx, cy + dy, r, g, b);
    }
  }
  void disc(double cx, double cy, double radius, uint8_t r, uint8_t g, uint8_t b) {
    for (int y = static_cast<int>(cy - radius) - 1; y <= cy + radius + 1; ++y)
      for (int x = static_cast<int>(cx - radius) - 1; x <= cx + radius + 1; ++x)
        if (std::hypot(x - cx, y - cy) <= radius) pixel(x, y, r, g, b);
  }
  // Text with its top-left corner at (x, y); unknown characters are left blank.
  void text(int x, int y, const std::string& s, int scale = 2) {
    for (char ch : s) {
      auto it = font().find(ch);
      if (it != font().end())
        for (int row = 0; row < 5; ++row)
          for (int col = 0; col < 3; ++col)
            if (it->second[row][col] == '#')
              for (int sy = 0; sy < scale; ++sy)
                for (int sx = 0; sx < scale; ++sx) pixel(x + col * scale + sx, y + row * scale + sy, 0, 0, 0);
      x += 4 * scale;
    }
  }
  static int text_width(const std::string& s, int scale = 2) {
    return static_cast<int>(s.size()) * 4 * scale;
  }
  const std::vector<uint8_t>& rgb() const { return rgb_; }
  int width() const { return w_; }
  int height() const { return h_; }

 private:
  int w_, h_;
  std::vector<uint8_t> rgb_;
};

std::string tick_label(double v) {
  char buf[32];
  if (std::fabs(v - std::round(v)) < 1e-9)
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else
    std::snprintf(buf, sizeof buf, "%.2f", v);
  std::string s = buf;
  if (s.find('.') != std::string::npos)
    while (s.back() == '0') s.pop_back();
  return s;
}

// A "nice" tick step giving about `target` intervals over [0, max].
double tick_step(double max, int target) {
  const double raw = max / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * mag >= raw) return m * mag;
  return 10 * mag;
}

void draw_panel(Canvas& c, const ChartPanel& p, int x_off, int panel_w) {
  const int left = x_off + 56, right = x_off + panel_w - 20, top = 36, bottom = c.height() - 48;
  auto px = [&](double x) { return left + x / p.x_max * (right - left); };
  auto py = [&](double y) { return bottom - y / p.y_max * (bottom - top); };
  c.text(x_off + (panel_w - Canvas::text_width(p.title)) / 2, 10, p.title);
  const double xs = p.integer_x ? std::max(1.0, tick_step(p.x_max, 8)) : tick_step(p.x_max, 8),
               ys = tick_step(p.y_max, 6);
  for (double y = 0; y <= p.y_max + 1e-9; y += ys) {
    c.line(left, py(y), right, py(y), 225, 225, 225);
    const std::string l = tick_label(y);
    c.text(left - 8 - Canvas::text_width(l), static_cast<int>(py(y)) - 5, l);
  }
  for (double x = 0; x <= p.x_max + 1e-9; x += xs) {
    c.line(px(x), top, px(x), bottom, 225, 225, 225);
    const std::string l = tick_label(x);
    c.text(static_cast<int>(px(x)) - Canvas::text_width(l) / 2, bottom + 8, l);
  }
  c.text(left + (right - left - Canvas::text_width(p.x_label)) / 2, bottom + 28, p.x_label);
  c.line(left, top, left, bottom, 0, 0, 0, 2);
  c.line(left, bottom, right, bottom, 0, 0, 0, 2);
  for (const ChartSeries& s : p.series) {
    for (size_t i = 1; i < s.x.size(); ++i)
      c.line(px(s.x[i - 1]), py(s.y[i - 1]), px(s.x[i]), py(s.y[i]), s.r, s.g, s.b, s.dashed ? 1 : 3,
             s.dashed);
    if (s.points)
      for (size_t i = 0; i < s.x.size(); ++i) c.disc(px(s.x[i]), py(s.y[i]), 5, s.r, s.g, s.b);
  }
}

std::string encode_png(const Canvas& c) {
  spng_ctx* ctx = spng_ctx_new(SPNG_CTX_ENCODER);
  if (!ctx) throw std::runtime_error("chart: spng_ctx_new failed");
  spng_set_option(ctx, SPNG_ENCODE_TO_BUFFER, 1);
  spng_ihdr ihdr{};
  ihdr.width = static_cast<uint32_t>(c.width());
  ihdr.height = static_cast<uint32_t>(c.height());
  ihdr.bit_depth = 8;
  ihdr.color_type = SPNG_COLOR_TYPE_TRUECOLOR;
  spng_set_ihdr(ctx, &ihdr);
  int rc = spng_encode_image(ctx, c.rgb().data(), c.rgb().size(), SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE);
  std::string out;
  if (rc == 0) {
    size_t len = 0;
    void* buf = spng_get_png_buffer(ctx, &len, &rc);
    if (buf) {
      out.assign(static_cast<const char*>(buf), len);
      std::free(buf);
    }
  }
  spng_ctx_free(ctx);
  if (rc != 0) throw std::runtime_error(std::string("chart: PNG encoding failed: ") + spng_strerror(rc));
  return out;
}

}  // namespace

std::string render_chart_png(const std::vector<ChartPanel>& panels, int panel_width, int height) {
  Canvas c(panel_width * static_cast<int>(std::max<size_t>(1, panels.size())), height);
  for (size_t i = 0; i < panels.size(); ++i)
    draw_panel(c, panels[i], static_cast<int>(i) * panel_width, panel_width);
  return encode_png(c);
}

}  // namespace trainer
