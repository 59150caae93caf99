// Writes what scripts/torchvision_augment_parity.py needs to check data/augment/ against
// torchvision.transforms.functional on the same uint8 images (ctest torchvision_augment_parity):
//   OUT_DIR/image_<k>.bin   input images, uint8 HWC
//   OUT_DIR/case_<n>.bin    our output of case n, uint8 HWC
//   OUT_DIR/manifest.txt    "image k H W C", "case n k OP VALUE..." (OP: an _apply_op name with its
//                           signed magnitude, or adjust_* with its factor)
//   OUT_DIR/tables.txt      "space NAME BINS H W OP SIGNED V0 V1 ...", "policy I OP P BIN": the
//                           augmentation spaces and AutoAugment's ImageNet policy, values as %.9g
//                           (float32 reads back exactly)
//   build/augment_parity_dump OUT_DIR
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/augment/colour.h"
#include "data/augment/policies.h"
#include "data/image_size.h"
#include "nn/random.h"

namespace {

using namespace trainer;

struct Image {
  ImageSize size;
  std::vector<uint8_t> pixels;
};

// Smooth colour fields with some noise (photograph-like), pure noise (every nearest-neighbour miss
// shows), a narrow band of levels with grey pixels (autocontrast, equalize, hue's grey path), a grey
// Fashion-MNIST-sized image, and a 224x224 one.
std::vector<Image> test_images() {
  Generator gen(2026);
  std::vector<Image> images;
  const auto add = [&](int64_t h, int64_t w, int64_t c, auto&& pixel) {
    Image image{{h, w, c}, std::vector<uint8_t>(static_cast<size_t>(h * w * c))};
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < w; ++x)
        for (int64_t ch = 0; ch < c; ++ch) {
          const double v = pixel(static_cast<double>(y) / h, static_cast<double>(x) / w, ch);
          image.pixels[static_cast<size_t>((y * w + x) * c + ch)] =
              static_cast<uint8_t>(std::clamp(v, 0.0, 255.0));
        }
    images.push_back(std::move(image));
  };
  const auto smooth = [&](double y, double x, int64_t ch) {
    return 128 + 90 * std::sin(6.0 * x + 2.0 * ch) * std::cos(4.0 * y - ch) + 20 * gen.normal();
  };
  add(57, 33, 3, smooth);
  add(224, 224, 3, smooth);
  add(48, 64, 3, [&](double, double, int64_t) { return static_cast<double>(gen.below(256)); });
  add(40, 40, 3, [&](double y, double x, int64_t ch) {
    const bool grey = x < 0.25;  // r = g = b on the left quarter
    return 60 + 60 * (grey ? y : std::fmod(x + 0.3 * ch + 0.2 * y, 1.0));
  });
  add(28, 28, 1, [&](double y, double x, int64_t) { return 255 * x * y + 10 * gen.normal(); });
  return images;
}

struct Case {
  std::string op;
  std::vector<double> values;
};

// Every op of the spaces at a spread of bins, both signs, plus ColorJitter's factors and erasing boxes.
std::vector<Case> test_cases(ImageSize size) {
  std::vector<Case> cases;
  const auto add_space = [&](const std::vector<OpSpace>& space, std::vector<size_t> bins) {
    for (const OpSpace& op : space) {
      if (op.magnitudes.empty()) {
        cases.push_back({op_name(op.op), {0.0}});
        continue;
      }
      for (size_t bin : bins) {
        const double m = op.magnitudes.at(std::min(bin, op.magnitudes.size() - 1));
        cases.push_back({op_name(op.op), {m}});
        if (op.is_signed && m != 0) cases.push_back({op_name(op.op), {-m}});
      }
    }
  };
  add_space(randaugment_space(31, size.height, size.width), {0, 5, 9, 17, 30});
  add_space(trivial_augment_wide_space(31), {3, 22, 30});
  cases.push_back({"Invert", {0.0}});
  for (double f : {0.0, 0.35, 0.8, 1.0, 1.27, 1.9}) {
    cases.push_back({"adjust_brightness", {f}});
    cases.push_back({"adjust_contrast", {f}});
    cases.push_back({"adjust_saturation", {f}});
  }
  for (double f : {-0.5, -0.31, -0.05, 0.0, 0.12, 0.4999}) cases.push_back({"adjust_hue", {f}});
  return cases;
}

void apply_case(const Case& c, Image& image, std::vector<uint8_t>& scratch) {
  uint8_t* px = image.pixels.data();
  const double v = c.values[0];
  if (c.op == "adjust_brightness") return adjust_brightness(px, image.size, v);
  if (c.op == "adjust_contrast") return adjust_contrast(px, image.size, v);
  if (c.op == "adjust_saturation") return adjust_saturation(px, image.size, v);
  if (c.op == "adjust_hue") return adjust_hue(px, image.size, v);
  for (int op = 0; op <= static_cast<int>(AugmentOp::invert); ++op)
    if (c.op == op_name(static_cast<AugmentOp>(op)))
      return apply_op(static_cast<AugmentOp>(op), v, px, image.size, scratch);
  throw std::runtime_error("unknown case op " + c.op);
}

void write_bytes(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

void write_space(std::FILE* out, const char* name, int bins, ImageSize size,
                 const std::vector<OpSpace>& space) {
  for (const OpSpace& op : space) {
    std::fprintf(out, "space %s %d %lld %lld %s %d", name, bins, static_cast<long long>(size.height),
                 static_cast<long long>(size.width), op_name(op.op), op.is_signed ? 1 : 0);
    for (float v : op.magnitudes) std::fprintf(out, " %.9g", static_cast<double>(v));
    std::fprintf(out, "\n");
  }
}

void write_tables(const std::filesystem::path& path) {
  std::FILE* out = std::fopen(path.c_str(), "w");
  for (ImageSize size : {ImageSize{224, 224, 3}, ImageSize{32, 32, 3}, ImageSize{57, 33, 3}}) {
    for (int bins : {31, 11, 2}) {
      write_space(out, "randaugment", bins, size, randaugment_space(bins, size.height, size.width));
      write_space(out, "trivialaugmentwide", bins, size, trivial_augment_wide_space(bins));
    }
    write_space(out, "autoaugment", 10, size, autoaugment_space(size.height, size.width));
  }
  const auto& policy = autoaugment_imagenet_policy();
  for (size_t i = 0; i < policy.size(); ++i)
    for (const PolicyStep& step : policy[i])
      std::fprintf(out, "policy %zu %s %.9g %d\n", i, op_name(step.op), step.probability, step.magnitude_bin);
  std::fclose(out);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: augment_parity_dump OUT_DIR\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  std::FILE* manifest = std::fopen((dir / "manifest.txt").c_str(), "w");
  std::vector<uint8_t> scratch;
  int n = 0;
  const std::vector<Image> images = test_images();
  for (size_t k = 0; k < images.size(); ++k) {
    const Image& image = images[k];
    std::fprintf(manifest, "image %zu %lld %lld %lld\n", k, static_cast<long long>(image.size.height),
                 static_cast<long long>(image.size.width), static_cast<long long>(image.size.channels));
    write_bytes(dir / ("image_" + std::to_string(k) + ".bin"), image.pixels);
    for (const Case& c : test_cases(image.size)) {
      Image out = image;
      apply_case(c, out, scratch);
      std::fprintf(manifest, "case %d %zu %s %.17g\n", n, k, c.op.c_str(), c.values[0]);
      write_bytes(dir / ("case_" + std::to_string(n++) + ".bin"), out.pixels);
    }
  }
  std::fclose(manifest);
  write_tables(dir / "tables.txt");
  std::printf("augment_parity_dump: %d cases on %zu images in %s\n", n, images.size(), dir.c_str());
  return 0;
}
