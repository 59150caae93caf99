// Microseconds per 224x224x3 image of each data/augment/ op and of each pipeline, one thread: where
// an augmented sample's time goes (bench-data times the whole loader). Images are photograph-like (a
// smooth field with noise); each op runs at a mid magnitude.
//   build/augment_ops_bench [--size 224] [--repeats 200]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "data/augment/augment.h"
#include "data/augment/policies.h"

namespace {

using namespace trainer;

double microseconds_per_call(int repeats, const std::vector<uint8_t>& image, std::vector<uint8_t>& work,
                             const std::function<void(uint8_t*)>& op) {
  double best = 1e30;
  for (int round = 0; round < 3; ++round) {  // the best of three rounds: the host is shared
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < repeats; ++i) {
      std::memcpy(work.data(), image.data(), image.size());
      op(work.data());
    }
    const std::chrono::duration<double, std::micro> took = std::chrono::steady_clock::now() - start;
    best = std::min(best, took.count() / repeats);
  }
  return best;
}

double mid_magnitude(AugmentOp op) {
  switch (op) {
    case AugmentOp::translate_x:
    case AugmentOp::translate_y:
      return 30.0;
    case AugmentOp::rotate:
      return 9.0;
    case AugmentOp::posterize:
      return 6.0;
    case AugmentOp::solarize:
      return 170.0;
    default:
      return 0.27;
  }
}

AugmentConfig pipeline(AugmentPolicy policy, double erasing) {
  AugmentConfig config;
  config.policy = policy;
  config.erasing.probability = erasing;
  config.erasing.value = ErasingValue::random;
  return config;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t side = 224;
  int repeats = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--size") side = std::stoll(argv[i + 1]);
    if (std::string(argv[i]) == "--repeats") repeats = std::stoi(argv[i + 1]);
  }
  const ImageSize size{side, side, 3};
  std::vector<uint8_t> image(static_cast<size_t>(size.bytes())), work(image.size()), scratch;
  Generator gen(7);
  for (int64_t i = 0; i < size.bytes(); ++i) {
    const double x = static_cast<double>(i % (side * 3)) / static_cast<double>(side * 3);
    image[static_cast<size_t>(i)] = static_cast<uint8_t>(
        std::clamp(128 + 90 * std::sin(9 * x + i / (side * 3) * 0.03) + 15 * gen.normal(), 0.0, 255.0));
  }
  std::printf("%-32s %10s\n", "op (224x224x3 unless --size)", "us/image");
  for (int op = 0; op <= static_cast<int>(AugmentOp::invert); ++op) {
    const AugmentOp o = static_cast<AugmentOp>(op);
    std::printf("%-32s %10.1f\n", op_name(o), microseconds_per_call(repeats, image, work, [&](uint8_t* px) {
                  apply_op(o, mid_magnitude(o), px, size, scratch);
                }));
  }
  ColorJitterConfig jitter{0.4, 0.4, 0.4, 0.1};
  std::printf(
      "%-32s %10.1f\n", "ColorJitter(0.4, 0.4, 0.4, 0.1)",
      microseconds_per_call(repeats, image, work, [&](uint8_t* px) { color_jitter(jitter, px, size, gen); }));
  const struct {
    const char* name;
    AugmentConfig config;
  } pipelines[] = {
      {"RandAugment(2, 9)", pipeline(AugmentPolicy::randaugment, 0.0)},
      {"RandAugment(2, 9) + erasing 0.25", pipeline(AugmentPolicy::randaugment, 0.25)},
      {"TrivialAugmentWide", pipeline(AugmentPolicy::trivialaugment, 0.0)},
      {"AutoAugment(ImageNet)", pipeline(AugmentPolicy::autoaugment, 0.0)},
      {"RandomErasing(1.0, random)", pipeline(AugmentPolicy::none, 1.0)},
  };
  for (const auto& p : pipelines)
    std::printf("%-32s %10.1f\n", p.name, microseconds_per_call(repeats, image, work, [&](uint8_t* px) {
                  apply_augment(p.config, px, size, gen, scratch);
                }));
  return 0;
}
