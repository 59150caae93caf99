#include "data/augment/policies.h"

#include <cmath>
#include <stdexcept>

#include "data/augment/colour.h"
#include "data/augment/geometric.h"
#include "data/augment/histogram.h"

namespace trainer {

const char* op_name(AugmentOp op) {
  switch (op) {
    case AugmentOp::identity:
      return "Identity";
    case AugmentOp::shear_x:
      return "ShearX";
    case AugmentOp::shear_y:
      return "ShearY";
    case AugmentOp::translate_x:
      return "TranslateX";
    case AugmentOp::translate_y:
      return "TranslateY";
    case AugmentOp::rotate:
      return "Rotate";
    case AugmentOp::brightness:
      return "Brightness";
    case AugmentOp::color:
      return "Color";
    case AugmentOp::contrast:
      return "Contrast";
    case AugmentOp::sharpness:
      return "Sharpness";
    case AugmentOp::posterize:
      return "Posterize";
    case AugmentOp::solarize:
      return "Solarize";
    case AugmentOp::autocontrast:
      return "AutoContrast";
    case AugmentOp::equalize:
      return "Equalize";
    case AugmentOp::invert:
      return "Invert";
  }
  return "?";
}

float torch_linspace(float start, float end, int64_t steps, int64_t index) {
  if (steps == 1) return start;
  const float step = (end - start) / static_cast<float>(steps - 1);
  const int64_t halfway = steps / 2;
  // One value the way the scalar loop computes it, which the compiler contracts into a fused
  // multiply-add: start + step * i up to halfway, end - step * (steps - 1 - i) from there.
  const auto scalar = [&](int64_t i) {
    return i < halfway ? std::fma(step, static_cast<float>(i), start)
                       : std::fma(-step, static_cast<float>(steps - 1 - i), end);
  };
  // PyTorch's vectorised loop (AVX2: 8 floats, two vectors at a time) covers the largest multiple of
  // 16 values: each vector starts at the scalar formula's value and adds k * step, rounded twice. Checked
  // against torch.linspace for every table the policies use (scripts/torchvision_augment_parity.py).
  constexpr int64_t kLanes = 8;
  const int64_t vectorised = steps / (2 * kLanes) * (2 * kLanes);
  if (index >= vectorised) return scalar(index);
  const int64_t lane = index % kLanes;
  const float product = static_cast<float>(lane) * step;
  return scalar(index - lane) + product;
}

namespace {

std::vector<float> linspace(double start, double end, int steps) {
  std::vector<float> values(static_cast<size_t>(steps));
  for (int i = 0; i < steps; ++i)
    values[static_cast<size_t>(i)] =
        torch_linspace(static_cast<float>(start), static_cast<float>(end), steps, i);
  return values;
}

// 8 - round(arange(bins) / ((bins - 1) / levels)) in float32, rounding halves to even.
std::vector<float> posterize_bits(int bins, double levels) {
  const float divisor = static_cast<float>(static_cast<double>(bins - 1) / levels);
  std::vector<float> values(static_cast<size_t>(bins));
  for (int i = 0; i < bins; ++i)
    values[static_cast<size_t>(i)] = 8.0f - std::nearbyint(static_cast<float>(i) / divisor);
  return values;
}

// The space RandAugment and AutoAugment share, with `bins` bins.
std::vector<OpSpace> randaugment_ops(int bins, int64_t height, int64_t width) {
  return {
      {AugmentOp::shear_x, linspace(0.0, 0.3, bins), true},
      {AugmentOp::shear_y, linspace(0.0, 0.3, bins), true},
      {AugmentOp::translate_x, linspace(0.0, 150.0 / 331.0 * static_cast<double>(width), bins), true},
      {AugmentOp::translate_y, linspace(0.0, 150.0 / 331.0 * static_cast<double>(height), bins), true},
      {AugmentOp::rotate, linspace(0.0, 30.0, bins), true},
      {AugmentOp::brightness, linspace(0.0, 0.9, bins), true},
      {AugmentOp::color, linspace(0.0, 0.9, bins), true},
      {AugmentOp::contrast, linspace(0.0, 0.9, bins), true},
      {AugmentOp::sharpness, linspace(0.0, 0.9, bins), true},
      {AugmentOp::posterize, posterize_bits(bins, 4.0), false},
      {AugmentOp::solarize, linspace(255.0, 0.0, bins), false},
      {AugmentOp::autocontrast, {}, false},
      {AugmentOp::equalize, {}, false},
  };
}

void check_bins(int bins) {
  if (bins < 2)
    throw std::invalid_argument("augmentation: need at least 2 magnitude bins, got " + std::to_string(bins));
}

}  // namespace

std::vector<OpSpace> randaugment_space(int bins, int64_t height, int64_t width) {
  check_bins(bins);
  std::vector<OpSpace> space = {{AugmentOp::identity, {}, false}};
  for (OpSpace& op : randaugment_ops(bins, height, width)) space.push_back(std::move(op));
  return space;
}

std::vector<OpSpace> trivial_augment_wide_space(int bins) {
  check_bins(bins);
  return {
      {AugmentOp::identity, {}, false},
      {AugmentOp::shear_x, linspace(0.0, 0.99, bins), true},
      {AugmentOp::shear_y, linspace(0.0, 0.99, bins), true},
      {AugmentOp::translate_x, linspace(0.0, 32.0, bins), true},
      {AugmentOp::translate_y, linspace(0.0, 32.0, bins), true},
      {AugmentOp::rotate, linspace(0.0, 135.0, bins), true},
      {AugmentOp::brightness, linspace(0.0, 0.99, bins), true},
      {AugmentOp::color, linspace(0.0, 0.99, bins), true},
      {AugmentOp::contrast, linspace(0.0, 0.99, bins), true},
      {AugmentOp::sharpness, linspace(0.0, 0.99, bins), true},
      {AugmentOp::posterize, posterize_bits(bins, 6.0), false},
      {AugmentOp::solarize, linspace(255.0, 0.0, bins), false},
      {AugmentOp::autocontrast, {}, false},
      {AugmentOp::equalize, {}, false},
  };
}

std::vector<OpSpace> autoaugment_space(int64_t height, int64_t width) {
  std::vector<OpSpace> space = randaugment_ops(10, height, width);
  space.push_back({AugmentOp::invert, {}, false});
  return space;
}

const std::vector<std::array<PolicyStep, 2>>& autoaugment_imagenet_policy() {
  using Op = AugmentOp;
  // Cubuk et al. (2019), table 9, as torchvision lists it.
  static const std::vector<std::array<PolicyStep, 2>> policy = {
      {{{Op::posterize, 0.4, 8}, {Op::rotate, 0.6, 9}}},
      {{{Op::solarize, 0.6, 5}, {Op::autocontrast, 0.6, -1}}},
      {{{Op::equalize, 0.8, -1}, {Op::equalize, 0.6, -1}}},
      {{{Op::posterize, 0.6, 7}, {Op::posterize, 0.6, 6}}},
      {{{Op::equalize, 0.4, -1}, {Op::solarize, 0.2, 4}}},
      {{{Op::equalize, 0.4, -1}, {Op::rotate, 0.8, 8}}},
      {{{Op::solarize, 0.6, 3}, {Op::equalize, 0.6, -1}}},
      {{{Op::posterize, 0.8, 5}, {Op::equalize, 1.0, -1}}},
      {{{Op::rotate, 0.2, 3}, {Op::solarize, 0.6, 8}}},
      {{{Op::equalize, 0.6, -1}, {Op::posterize, 0.4, 6}}},
      {{{Op::rotate, 0.8, 8}, {Op::color, 0.4, 0}}},
      {{{Op::rotate, 0.4, 9}, {Op::equalize, 0.6, -1}}},
      {{{Op::equalize, 0.0, -1}, {Op::equalize, 0.8, -1}}},
      {{{Op::invert, 0.6, -1}, {Op::equalize, 1.0, -1}}},
      {{{Op::color, 0.6, 4}, {Op::contrast, 1.0, 8}}},
      {{{Op::rotate, 0.8, 8}, {Op::color, 1.0, 2}}},
      {{{Op::color, 0.8, 8}, {Op::solarize, 0.8, 7}}},
      {{{Op::sharpness, 0.4, 7}, {Op::invert, 0.6, -1}}},
      {{{Op::shear_x, 0.6, 5}, {Op::equalize, 1.0, -1}}},
      {{{Op::color, 0.4, 0}, {Op::equalize, 0.6, -1}}},
      {{{Op::equalize, 0.4, -1}, {Op::solarize, 0.2, 4}}},
      {{{Op::solarize, 0.6, 5}, {Op::autocontrast, 0.6, -1}}},
      {{{Op::invert, 0.6, -1}, {Op::equalize, 1.0, -1}}},
      {{{Op::color, 0.6, 4}, {Op::contrast, 1.0, 8}}},
      {{{Op::equalize, 0.8, -1}, {Op::equalize, 0.6, -1}}},
  };
  return policy;
}

void apply_op(AugmentOp op, double magnitude, uint8_t* hwc, ImageSize size, std::vector<uint8_t>& scratch) {
  switch (op) {
    case AugmentOp::identity:
      return;
    case AugmentOp::shear_x:
      return shear_x(hwc, size, magnitude, scratch);
    case AugmentOp::shear_y:
      return shear_y(hwc, size, magnitude, scratch);
    case AugmentOp::translate_x:
      return translate_x(hwc, size, magnitude, scratch);
    case AugmentOp::translate_y:
      return translate_y(hwc, size, magnitude, scratch);
    case AugmentOp::rotate:
      return rotate(hwc, size, magnitude, scratch);
    case AugmentOp::brightness:
      return adjust_brightness(hwc, size, 1.0 + magnitude);
    case AugmentOp::color:
      return adjust_saturation(hwc, size, 1.0 + magnitude);
    case AugmentOp::contrast:
      return adjust_contrast(hwc, size, 1.0 + magnitude);
    case AugmentOp::sharpness:
      return adjust_sharpness(hwc, size, 1.0 + magnitude, scratch);
    case AugmentOp::posterize:
      return posterize(hwc, size, static_cast<int>(magnitude));
    case AugmentOp::solarize:
      return solarize(hwc, size, magnitude);
    case AugmentOp::autocontrast:
      return autocontrast(hwc, size);
    case AugmentOp::equalize:
      return equalize(hwc, size);
    case AugmentOp::invert:
      return invert(hwc, size);
  }
}

namespace {

// The op's magnitude at `bin`, negated when signed and the coin says so; 0 for an op without one.
double signed_magnitude(const OpSpace& op, size_t bin, bool negate) {
  if (op.magnitudes.empty()) return 0.0;
  const double magnitude = op.magnitudes.at(bin);
  return op.is_signed && negate ? -magnitude : magnitude;
}

}  // namespace

void rand_augment(int num_ops, int magnitude_bin, int bins, uint8_t* hwc, ImageSize size, Generator& gen,
                  std::vector<uint8_t>& scratch) {
  const std::vector<OpSpace> space = randaugment_space(bins, size.height, size.width);
  for (int i = 0; i < num_ops; ++i) {
    const OpSpace& op = space[gen.below(space.size())];
    const bool negate = gen.below(2) == 1;
    apply_op(op.op, signed_magnitude(op, static_cast<size_t>(magnitude_bin), negate), hwc, size, scratch);
  }
}

void trivial_augment_wide(int bins, uint8_t* hwc, ImageSize size, Generator& gen,
                          std::vector<uint8_t>& scratch) {
  const std::vector<OpSpace> space = trivial_augment_wide_space(bins);
  const OpSpace& op = space[gen.below(space.size())];
  const size_t bin = gen.below(static_cast<uint64_t>(bins));
  const bool negate = gen.below(2) == 1;
  apply_op(op.op, signed_magnitude(op, bin, negate), hwc, size, scratch);
}

void auto_augment_imagenet(uint8_t* hwc, ImageSize size, Generator& gen, std::vector<uint8_t>& scratch) {
  const auto& policy = autoaugment_imagenet_policy();
  const std::array<PolicyStep, 2>& pair = policy[gen.below(policy.size())];
  const double probs[2] = {gen.uniform(), gen.uniform()};
  const bool negate[2] = {gen.below(2) == 0, gen.below(2) == 0};  // torchvision negates on a 0
  const std::vector<OpSpace> space = autoaugment_space(size.height, size.width);
  for (int i = 0; i < 2; ++i) {
    const PolicyStep& step = pair[static_cast<size_t>(i)];
    if (!(probs[i] <= step.probability)) continue;
    double magnitude = 0.0;
    for (const OpSpace& op : space)
      if (op.op == step.op && step.magnitude_bin >= 0)
        magnitude = signed_magnitude(op, static_cast<size_t>(step.magnitude_bin), negate[i]);
    apply_op(step.op, magnitude, hwc, size, scratch);
  }
}

}  // namespace trainer
