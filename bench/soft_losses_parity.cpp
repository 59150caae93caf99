// Writes what scripts/torch_parity_soft_losses.py needs to check the soft-target losses and the batch
// mixing against PyTorch (timm's formulas) in float64 on the CPU: for a Mixup and a CutMix draw and for
// no mixing, the labels, the draw (lambda, box), our mixed images and smoothed mixed targets, and for
// each loss (soft-target cross-entropy, BCE with logits) the logits, our loss and our gradient of it.
// Keys: "<case>.<tensor>", e.g. "cutmix.mixed", "cutmix.bce.grad_logits"; values in OUT_DIR/soft.safetensors.
//   build/soft_losses_parity OUT_DIR
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "nn/backend.h"
#include "nn/batch_mix.h"
#include "nn/functional.h"
#include "nn/random.h"
#include "nn/safetensors.h"

namespace {

using namespace trainer;
using Named = std::vector<std::pair<std::string, Tensor>>;

constexpr int64_t kN = 6, kC = 3, kH = 9, kW = 11, kK = 10;
constexpr double kSmoothing = 0.1;

Tensor draw(const Shape& shape, Generator& gen, double lo, double hi) {
  Tensor t = Tensor::empty(shape, DType::f64);
  uniform_(t, lo, hi, gen);
  return t;
}

void record_loss(Named& out, const std::string& name, const Tensor& targets, Generator& gen, bool bce) {
  Variable logits(draw({kN, kK}, gen, -5.0, 5.0), true);
  Variable loss = bce ? F::bce_with_logits(logits, targets) : F::soft_cross_entropy(logits, targets);
  loss.backward();
  out.emplace_back(name + ".logits", logits.data());
  out.emplace_back(name + ".loss", loss.data().reshape({1}));
  out.emplace_back(name + ".grad_logits", logits.grad().contiguous());
}

void record_case(Named& out, const std::string& name, const MixDraw& d, Generator& gen) {
  const Tensor images = draw({kN, kC, kH, kW}, gen, -2.0, 2.0);
  std::vector<int64_t> y;
  for (int64_t i = 0; i < kN; ++i) y.push_back(static_cast<int64_t>(gen.below(kK)));
  const Tensor labels = Tensor::from_vector(y, {kN});
  const Tensor draws = mix_draw_values(d);
  const Tensor targets = cpu_backend().mix_targets(labels, kK, kSmoothing, draws, DType::f64);
  out.emplace_back(name + ".images", images);
  out.emplace_back(name + ".labels", labels.to(DType::f64));
  out.emplace_back(name + ".draw", draws);  // [cutmix, lambda, y0, y1, x0, x1]
  out.emplace_back(name + ".mixed", cpu_backend().mix_images(images, draws));
  out.emplace_back(name + ".targets", targets);
  record_loss(out, name + ".soft_ce", targets, gen, false);
  record_loss(out, name + ".bce", targets, gen, true);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: soft_losses_parity OUT_DIR\n");
    return 2;
  }
  std::filesystem::create_directories(argv[1]);
  Generator gen(2026);
  Named out;
  MixSettings mixup, cutmix;
  mixup.mixup_alpha = 0.8;
  cutmix.cutmix_alpha = 1.0;
  // The first draws of a seed that mix (timm skips a batch whose lambda is exactly 1).
  record_case(out, "mixup", draw_mix(mixup, 3, 0, 0, kH, kW), gen);
  for (int64_t step = 0;; ++step) {
    const MixDraw d = draw_mix(cutmix, 3, step, 0, kH, kW);
    if (d.lambda < 1.0 && (d.y0 == 0 || d.x0 == 0 || d.y1 == kH || d.x1 == kW)) {  // a clipped box
      record_case(out, "cutmix", d, gen);
      break;
    }
  }
  record_case(out, "none", MixDraw{}, gen);
  const std::string path = std::string(argv[1]) + "/soft.safetensors";
  save_safetensors(path, out);
  std::printf("wrote %zu tensors to %s\n", out.size(), path.c_str());
  return 0;
}
