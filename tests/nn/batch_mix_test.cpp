// Mixup and CutMix draws and kernels (nn/batch_mix.h) on the CPU: lambda follows Beta(alpha, alpha)
// (Kolmogorov-Smirnov over many steps), CutMix's labels carry the pixels' areas, every rank and every
// resumed run draws the same for a step, and timm's probabilities (prob, switch_prob) hold.
#include "nn/batch_mix.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "nn/backend.h"
#include "nn/functional.h"
#include "nn/training_loss.h"

namespace trainer {
namespace {

// The regularised incomplete beta function I_x(a, b) by its continued fraction (modified Lentz),
// used on the side of x where it converges fast.
double beta_continued_fraction(double x, double a, double b) {
  const double tiny = 1e-300;
  double c = 1.0, d = 1.0 - (a + b) * x / (a + 1.0);
  d = 1.0 / (std::abs(d) < tiny ? tiny : d);
  double h = d;
  for (int m = 1; m < 1000; ++m) {
    for (int odd = 0; odd < 2; ++odd) {
      const double num = odd == 0 ? m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
                                  : -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1));
      d = 1.0 + num * d;
      d = 1.0 / (std::abs(d) < tiny ? tiny : d);
      c = 1.0 + num / c;
      if (std::abs(c) < tiny) c = tiny;
      h *= d * c;
      if (odd == 1 && std::abs(d * c - 1.0) < 1e-15) return h;
    }
  }
  return h;
}

double beta_cdf(double x, double a, double b) {
  if (x <= 0.0) return 0.0;
  if (x >= 1.0) return 1.0;
  const double front =
      std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log1p(-x));
  if (x < (a + 1.0) / (a + b + 2.0)) return front * beta_continued_fraction(x, a, b) / a;
  return 1.0 - front * beta_continued_fraction(1.0 - x, b, a) / b;
}

// sup |F_n - F| of the samples against Beta(alpha, alpha).
double ks_statistic(std::vector<double> samples, double alpha) {
  std::sort(samples.begin(), samples.end());
  const double n = static_cast<double>(samples.size());
  double worst = 0.0;
  for (size_t i = 0; i < samples.size(); ++i) {
    const double f = beta_cdf(samples[i], alpha, alpha);
    worst = std::max({worst, f - static_cast<double>(i) / n, static_cast<double>(i + 1) / n - f});
  }
  return worst;
}

TEST(BetaCdf, MatchesKnownValues) {
  EXPECT_NEAR(beta_cdf(0.3, 1.0, 1.0), 0.3, 1e-12);
  EXPECT_NEAR(beta_cdf(0.5, 0.2, 0.2), 0.5, 1e-12);
  // Beta(2, 2): 3x^2 - 2x^3.
  EXPECT_NEAR(beta_cdf(0.2, 2.0, 2.0), 3 * 0.04 - 2 * 0.008, 1e-12);
  // Beta(0.5, 0.5): (2 / pi) asin(sqrt(x)).
  EXPECT_NEAR(beta_cdf(0.1, 0.5, 0.5), 2.0 / M_PI * std::asin(std::sqrt(0.1)), 1e-10);
}

// Mixup's lambda over 20000 steps of one seed, for small, uniform and peaked alphas: the KS statistic
// stays under the 0.1% critical value 1.95 / sqrt(n).
TEST(MixDraws, LambdaFollowsBetaAlphaAlpha) {
  constexpr int kSteps = 20000;
  for (double alpha : {0.2, 0.8, 1.0, 2.0}) {
    MixSettings s;
    s.mixup_alpha = alpha;
    std::vector<double> lambdas;
    for (int step = 0; step < kSteps; ++step) {
      const MixDraw d = draw_mix(s, 17, step, 0, 32, 32);
      ASSERT_FALSE(d.cutmix);
      lambdas.push_back(d.lambda);
    }
    const double ks = ks_statistic(lambdas, alpha);
    EXPECT_LT(ks, 1.95 / std::sqrt(static_cast<double>(kSteps))) << "alpha " << alpha;
  }
}

TEST(MixDraws, BetaSamplerStaysInsideTheUnitIntervalForTinyAlpha) {
  Generator gen(3);
  for (int i = 0; i < 5000; ++i) {
    const double x = sample_beta(gen, 0.05);
    ASSERT_TRUE(x >= 0.0 && x <= 1.0) << x;
  }
}

// Two ranks (two mixers with one seed) draw the same for a step; another step or seed draws otherwise.
TEST(MixDraws, EveryRankDrawsTheSameForAStep) {
  MixSettings s;
  s.mixup_alpha = 0.8;
  s.cutmix_alpha = 1.0;
  BatchMixer rank0(s, 42, Device::cpu()), rank1(s, 42, Device::cpu());
  for (int64_t step : {0, 1, 7, 123456}) {
    for (int micro : {0, 1}) {
      rank0.stage(step, micro, 24, 24);
      rank1.stage(step, micro, 24, 24);
      EXPECT_EQ(rank0.draws().to_vector<double>(), rank1.draws().to_vector<double>()) << step;
    }
  }
  // A resumed run builds a fresh mixer: the draws of a step do not depend on the ones before it.
  BatchMixer resumed(s, 42, Device::cpu());
  resumed.stage(7, 0, 24, 24);
  rank0.stage(7, 0, 24, 24);
  EXPECT_EQ(resumed.draws().to_vector<double>(), rank0.draws().to_vector<double>());
  EXPECT_NE(draw_mix(s, 42, 7, 0, 24, 24).lambda, draw_mix(s, 42, 8, 0, 24, 24).lambda);
  EXPECT_NE(draw_mix(s, 42, 7, 0, 24, 24).lambda, draw_mix(s, 43, 7, 0, 24, 24).lambda);
}

// timm: a batch is mixed with probability prob; when both alphas are set, CutMix with switch_prob.
TEST(MixDraws, ProbAndSwitchProbAreHonoured) {
  MixSettings s;
  s.mixup_alpha = 0.8;
  s.cutmix_alpha = 1.0;
  s.prob = 0.6;
  s.switch_prob = 0.25;
  int mixed = 0, cut = 0;
  constexpr int kSteps = 20000;
  for (int step = 0; step < kSteps; ++step) {
    const MixDraw d = draw_mix(s, 5, step, 0, 32, 32);
    mixed += d.lambda < 1.0 ? 1 : 0;
    cut += d.cutmix ? 1 : 0;
  }
  EXPECT_NEAR(mixed / double(kSteps), 0.6, 0.015);
  EXPECT_NEAR(cut / double(mixed), 0.25, 0.015);
  s.mixup_alpha = 0.0;  // CutMix alone: every mixed batch cuts
  for (int step = 0; step < 200; ++step) {
    const MixDraw d = draw_mix(s, 5, step, 0, 32, 32);
    EXPECT_TRUE(d.lambda == 1.0 || d.cutmix);
  }
}

// Sample i of the batch is the constant i + 1 in every pixel, so each mixed pixel says whose it is.
Tensor numbered_batch(int64_t n, int64_t c, int64_t h, int64_t w) {
  std::vector<float> v;
  for (int64_t i = 0; i < n; ++i)
    v.insert(v.end(), static_cast<size_t>(c * h * w), static_cast<float>(i + 1));
  return Tensor::from_vector(v, {n, c, h, w});
}

// CutMix: the box lies inside the image, the pixels taken from the partner are exactly the box, and
// the partner's label weight in the targets equals their share of the image (lambda corrected).
TEST(MixKernels, CutMixLabelsMatchThePixelsAreas) {
  MixSettings s;
  s.cutmix_alpha = 1.0;
  constexpr int64_t N = 5, C = 2, H = 13, W = 20, K = 6;
  const Tensor images = numbered_batch(N, C, H, W);
  const Tensor labels = Tensor::from_vector<int64_t>({0, 1, 2, 3, 4}, {N});
  int clipped = 0;
  for (int step = 0; step < 300; ++step) {
    BatchMixer mixer(s, 9, Device::cpu());
    const MixDraw d = mixer.stage(step, 0, H, W);
    if (d.lambda == 1.0) continue;
    ASSERT_TRUE(d.cutmix);
    ASSERT_TRUE(0 <= d.y0 && d.y0 <= d.y1 && d.y1 <= H && 0 <= d.x0 && d.x0 <= d.x1 && d.x1 <= W);
    clipped += (d.y0 == 0 || d.x0 == 0 || d.y1 == H || d.x1 == W) ? 1 : 0;
    const std::vector<float> mixed = cpu_backend().mix_images(images, mixer.draws()).to_vector<float>();
    const std::vector<double> targets =
        cpu_backend().mix_targets(labels, K, 0.0, mixer.draws(), DType::f64).to_vector<double>();
    for (int64_t i = 0; i < N; ++i) {
      const int64_t partner = N - 1 - i;
      int64_t from_partner = 0;
      for (int64_t p = 0; p < C * H * W; ++p)
        from_partner += mixed[static_cast<size_t>(i * C * H * W + p)] == static_cast<float>(partner + 1);
      const double area = i == partner ? 0.0 : static_cast<double>(from_partner) / (C * H * W);
      if (i != partner) {
        EXPECT_NEAR(area, 1.0 - d.lambda, 1e-12) << "step " << step << " sample " << i;
        EXPECT_NEAR(targets[static_cast<size_t>(i * K + partner)], area, 1e-12);
        EXPECT_NEAR(targets[static_cast<size_t>(i * K + i)], 1.0 - area, 1e-12);
      } else {
        EXPECT_NEAR(targets[static_cast<size_t>(i * K + i)], 1.0, 1e-12);  // the middle sample: itself
      }
    }
  }
  EXPECT_GT(clipped, 10);  // the clipping path was exercised
}

// Mixup: every pixel is lambda * own + (1 - lambda) * partner; the targets are timm's mixup_target
// (smoothed one-hots, off = eps / K, on = 1 - eps + off, mixed by lambda) and each row sums to 1.
TEST(MixKernels, MixupBlendsPixelsAndSmoothedTargets) {
  MixSettings s;
  s.mixup_alpha = 0.4;
  constexpr int64_t N = 4, K = 5;
  const double eps = 0.1, off = eps / K, on = 1.0 - eps + off;
  const Tensor images = numbered_batch(N, 3, 4, 4).to(DType::f64);
  const Tensor labels = Tensor::from_vector<int64_t>({3, 3, 0, 1}, {N});
  BatchMixer mixer(s, 1, Device::cpu());
  const MixDraw d = mixer.stage(11, 0, 4, 4);
  ASSERT_LT(d.lambda, 1.0);
  const std::vector<double> mixed = cpu_backend().mix_images(images, mixer.draws()).to_vector<double>();
  const std::vector<double> t =
      cpu_backend().mix_targets(labels, K, eps, mixer.draws(), DType::f64).to_vector<double>();
  const std::vector<int64_t> y = {3, 3, 0, 1};
  for (int64_t i = 0; i < N; ++i) {
    EXPECT_NEAR(mixed[static_cast<size_t>(i * 48 + 17)], d.lambda * (i + 1) + (1 - d.lambda) * (N - i),
                1e-12);
    double row = 0.0;
    for (int64_t k = 0; k < K; ++k) {
      const double expected =
          d.lambda * (k == y[i] ? on : off) + (1 - d.lambda) * (k == y[N - 1 - i] ? on : off);
      EXPECT_NEAR(t[static_cast<size_t>(i * K + k)], expected, 1e-12);
      row += t[static_cast<size_t>(i * K + k)];
    }
    EXPECT_NEAR(row, 1.0, 1e-12);
  }
}

// Soft-target cross-entropy on smoothed one-hots (lambda 1) equals torch's CrossEntropyLoss with label
// smoothing, the trainer's loss without mixing.
TEST(TrainingLoss, SoftTargetsWithoutMixingEqualLabelSmoothedCrossEntropy) {
  Generator gen(4);
  Tensor logits = Tensor::empty({6, 7}, DType::f64);
  uniform_(logits, -3, 3, gen);
  const Tensor labels = Tensor::from_vector<int64_t>({0, 6, 2, 2, 5, 1}, {6});
  BatchMixer mixer(MixSettings{}, 0, Device::cpu());
  TrainingLoss soft{.kind = LossKind::cross_entropy, .label_smoothing = 0.1, .draws = &mixer.draws()};
  TrainingLoss hard{.kind = LossKind::cross_entropy, .label_smoothing = 0.1};
  EXPECT_NEAR(training_loss(soft, Variable(logits), labels).item(),
              training_loss(hard, Variable(logits), labels).item(), 1e-6);  // f32 targets
  const Tensor images = logits.reshape({6, 7, 1, 1});
  EXPECT_EQ(training_images(soft, images).raw_data(), images.raw_data());  // no mixing: untouched
}

}  // namespace
}  // namespace trainer
