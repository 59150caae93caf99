#include "nn/batch_mix.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "nn/batch_mix_math.h"

namespace trainer {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// log of a Gamma(alpha, 1) sample. Below alpha = 1, Gamma(alpha) = Gamma(alpha + 1) * U^(1 / alpha)
// (Marsaglia and Tsang, section 6), kept in logarithms: U^(1 / 0.1) underflows for small U.
double log_gamma_sample(Generator& gen, double alpha) {
  if (alpha < 1.0) return log_gamma_sample(gen, alpha + 1.0) + std::log(1.0 - gen.uniform()) / alpha;
  const double d = alpha - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    const double x = gen.normal();
    double v = 1.0 + c * x;
    if (v <= 0.0) continue;
    v = v * v * v;
    const double u = 1.0 - gen.uniform();  // (0, 1]
    if (u < 1.0 - 0.0331 * x * x * x * x || std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v)))
      return std::log(d) + std::log(v);
  }
}

// CutMix's box for lambda in an h x w image, as timm's rand_bbox (margin 0): sides int(h * sqrt(1 -
// lambda)) and int(w * ...), the centre uniform over the image, the box clipped to it.
void draw_box(Generator& gen, int64_t h, int64_t w, MixDraw& draw) {
  const double ratio = std::sqrt(1.0 - draw.lambda);
  const int64_t cut_h = static_cast<int64_t>(static_cast<double>(h) * ratio);
  const int64_t cut_w = static_cast<int64_t>(static_cast<double>(w) * ratio);
  const int64_t cy = static_cast<int64_t>(gen.below(static_cast<uint64_t>(h)));
  const int64_t cx = static_cast<int64_t>(gen.below(static_cast<uint64_t>(w)));
  draw.y0 = std::clamp<int64_t>(cy - cut_h / 2, 0, h);
  draw.y1 = std::clamp<int64_t>(cy + cut_h / 2, 0, h);
  draw.x0 = std::clamp<int64_t>(cx - cut_w / 2, 0, w);
  draw.x1 = std::clamp<int64_t>(cx + cut_w / 2, 0, w);
  // The clipped box's true share of the image (timm's correct_lam).
  draw.lambda =
      1.0 - static_cast<double>((draw.y1 - draw.y0) * (draw.x1 - draw.x0)) / static_cast<double>(h * w);
}

}  // namespace

double sample_beta(Generator& gen, double alpha) {
  if (!(alpha > 0.0)) throw std::invalid_argument("sample_beta: alpha must be positive");
  const double a = log_gamma_sample(gen, alpha), b = log_gamma_sample(gen, alpha);
  return 1.0 / (1.0 + std::exp(b - a));  // Ga / (Ga + Gb)
}

Generator mix_generator(uint64_t seed, int64_t step, int micro) {
  const uint64_t salt = 0x6d69787570ULL;  // "mixup": apart from the other generators seeded from `seed`
  return Generator(splitmix64(splitmix64(seed ^ salt) ^ splitmix64(static_cast<uint64_t>(step)) ^
                              splitmix64(static_cast<uint64_t>(micro) + 0x100000000ULL)));
}

MixDraw draw_mix(const MixSettings& s, Generator& gen, int64_t height, int64_t width) {
  MixDraw draw;
  if (!s.enabled() || !(gen.uniform() < s.prob)) return draw;
  if (s.mixup_alpha > 0.0 && s.cutmix_alpha > 0.0) {
    draw.cutmix = gen.uniform() < s.switch_prob;
    draw.lambda = sample_beta(gen, draw.cutmix ? s.cutmix_alpha : s.mixup_alpha);
  } else if (s.mixup_alpha > 0.0) {
    draw.lambda = sample_beta(gen, s.mixup_alpha);
  } else {
    draw.cutmix = true;
    draw.lambda = sample_beta(gen, s.cutmix_alpha);
  }
  if (draw.lambda == 1.0) return MixDraw{};  // timm leaves such a batch alone
  if (draw.cutmix) draw_box(gen, height, width, draw);
  return draw;
}

MixDraw draw_mix(const MixSettings& settings, uint64_t seed, int64_t step, int micro, int64_t height,
                 int64_t width) {
  Generator gen = mix_generator(seed, step, micro);
  return draw_mix(settings, gen, height, width);
}

Tensor mix_draw_values(const MixDraw& d) {
  std::vector<double> v(kMixDrawValues);
  v[kMixCutmix] = d.cutmix ? 1.0 : 0.0;
  v[kMixLambda] = d.lambda;
  v[kMixBoxY0] = static_cast<double>(d.y0);
  v[kMixBoxY1] = static_cast<double>(d.y1);
  v[kMixBoxX0] = static_cast<double>(d.x0);
  v[kMixBoxX1] = static_cast<double>(d.x1);
  return Tensor::from_vector(v, {kMixDrawValues});
}

BatchMixer::BatchMixer(const MixSettings& settings, uint64_t seed, Device device)
    : settings_(settings), seed_(seed), draws_(mix_draw_values(MixDraw{}).to(device)) {}

const MixDraw& BatchMixer::stage(int64_t step, int micro, int64_t height, int64_t width) {
  last_ = draw_mix(settings_, seed_, step, micro, height, width);
  draws_.copy_(mix_draw_values(last_));  // same address: a captured step reads the new values
  return last_;
}

}  // namespace trainer
