// The soft-target losses (cross-entropy against a distribution, binary cross-entropy with logits) with
// their backwards, and the batch-mixing kernels (Mixup, CutMix, the mixed and smoothed targets) on
// fixed draws: a blend, a clipped box, lambda = 1, and an odd batch whose middle sample is its own partner.
#include "nn/batch_mix.h"
#include "op_case.h"

namespace trainer::op_cases {
namespace {

constexpr int64_t kN = 6, kK = 9;

// Soft targets in [0, 1) per class, not normalised: the backward's p * sum(t) - t is checked in general.
OpCase soft_cross_entropy_case() {
  OpCase c;
  c.name = "soft_cross_entropy and soft_cross_entropy_backward";
  c.inputs = {uniform({kN, kK}, -4.0, 4.0), uniform({kN, kK}, 0.0, 1.0), uniform({kN})};
  c.run = [](Backend& b, Tensors& in) {
    const auto [loss, probs] = b.soft_cross_entropy(in[0], in[1]);
    return Tensors{loss, probs, b.soft_cross_entropy_backward(in[2], probs, in[1])};
  };
  c.gradient = [](Backend& b, Tensors& in, const Tensor& g) {
    const auto [loss, probs] = b.soft_cross_entropy(in[0], in[1]);
    return Tensors{b.soft_cross_entropy_backward(g, probs, in[1])};
  };
  c.differentiable = {0};
  c.device_dtypes = {DType::f32, DType::bf16};
  return c;
}

OpCase bce_with_logits_case() {
  OpCase c;
  c.name = "bce_with_logits and bce_with_logits_backward";
  c.inputs = {uniform({kN, kK}, -6.0, 6.0), uniform({kN, kK}, 0.0, 1.0), uniform({kN})};
  c.run = [](Backend& b, Tensors& in) {
    return Tensors{b.bce_with_logits(in[0], in[1]), b.bce_with_logits_backward(in[2], in[0], in[1])};
  };
  c.gradient = [](Backend& b, Tensors& in, const Tensor& g) {
    return Tensors{b.bce_with_logits_backward(g, in[0], in[1])};
  };
  c.differentiable = {0};
  c.device_dtypes = {DType::f32, DType::bf16};
  return c;
}

MixDraw blend(double lambda) {
  MixDraw d;
  d.lambda = lambda;
  return d;
}

// A box clipped at the image's top edge, lambda corrected to its area.
MixDraw box() {
  MixDraw d;
  d.cutmix = true;
  d.y0 = 0, d.y1 = 3, d.x0 = 2, d.x1 = 6;
  d.lambda = 1.0 - 12.0 / 35.0;
  return d;
}

OpCase mix_images_case(const std::string& what, const MixDraw& draw, int64_t n) {
  OpCase c;
  c.name = "mix_images, " + what;
  c.inputs = {image({n, 3, 5, 7})};
  c.run = [draw](Backend& b, Tensors& in) {
    return Tensors{b.mix_images(in[0], mix_draw_values(draw).to(in[0].device()))};
  };
  c.device_dtypes = {DType::f32, DType::bf16};
  c.channels_last = true;
  return c;
}

OpCase mix_targets_case(const std::string& what, const MixDraw& draw, double smoothing) {
  OpCase c;
  c.name = "mix_targets, " + what;
  c.inputs = {labels(7, kK), uniform({1})};  // the second for the dtype under test only
  c.run = [draw, smoothing](Backend& b, Tensors& in) {
    const Tensor draws = mix_draw_values(draw).to(in[0].device());
    return Tensors{b.mix_targets(in[0], kK, smoothing, draws, in[1].dtype())};
  };
  c.device_dtypes = {DType::f32, DType::bf16};
  return c;
}

}  // namespace

std::vector<OpCase> soft_target_cases() {
  return {soft_cross_entropy_case(),
          bce_with_logits_case(),
          mix_images_case("mixup lambda 0.3", blend(0.3), 6),
          mix_images_case("mixup lambda 0.3, odd batch", blend(0.3), 5),
          mix_images_case("cutmix box clipped at the top", box(), 6),
          mix_images_case("lambda 1 leaves the batch", blend(1.0), 4),
          mix_targets_case("mixup lambda 0.3, smoothing 0.1", blend(0.3), 0.1),
          mix_targets_case("cutmix box, no smoothing", box(), 0.0),
          mix_targets_case("lambda 1, smoothing 0.2", blend(1.0), 0.2)};
}

}  // namespace trainer::op_cases
