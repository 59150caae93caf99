// CPU micro-benchmark: forward + backward (+ SGD step) images/s of a model at a batch size.
//   build/nn_bench [--model cnn|resnet18|...] [--batch 64] [--image 28] [--channels 1] [--iters 20]
// Default: the two figures of the core issue, cnn on 28x28x1 and resnet18-cifar on 32x32x3, batch 64.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "app/blas_kernels.h"
#include "nn/functional.h"
#include "nn/models/registry.h"
#include "nn/optim/sgd.h"
#include "nn/random.h"

namespace {

using namespace trainer;

struct Point {
  std::string model;
  int64_t batch, image, channels;
  int iters;
};

double run(const Point& p) {
  ModelOptions m;
  m.name = p.model;
  m.stem = "cifar";
  m.in_channels = p.channels;
  m.num_classes = 10;
  m.image_size = p.image;
  auto model = create_model(m);
  model->train();
  SgdOptions so;
  so.lr = 0.01;
  so.momentum = 0.9;
  Sgd opt(model->named_parameters(), so);
  Generator gen(1);
  Tensor x = Tensor::empty({p.batch, p.channels, p.image, p.image});
  normal_(x, 0, 1, gen);
  std::vector<int64_t> labels(p.batch);
  for (auto& l : labels) l = static_cast<int64_t>(gen.below(10));
  Tensor y = Tensor::from_vector(labels, {p.batch});
  auto step = [&] {
    Variable loss = F::cross_entropy((*model)(Variable(x)), y);
    loss.backward();
    opt.step();
    opt.zero_grad();
  };
  for (int i = 0; i < 2; ++i) step();  // warm-up: allocator, BLAS thread pool
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < p.iters; ++i) step();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return p.batch * p.iters / s;
}

}  // namespace

int main(int argc, char** argv) {
  trainer::select_fast_blas_kernels(argv);
  std::vector<Point> points;
  Point custom{"", 64, 28, 1, 20};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--model") custom.model = v;
    else if (k == "--batch") custom.batch = std::atoll(v);
    else if (k == "--image") custom.image = std::atoll(v);
    else if (k == "--channels") custom.channels = std::atoll(v);
    else if (k == "--iters") custom.iters = std::atoi(v);
    else { std::fprintf(stderr, "unknown option %s\n", argv[i]); return 2; }
  }
  if (!custom.model.empty()) points.push_back(custom);
  else points = {{"cnn", 64, 28, 1, 30}, {"resnet18", 64, 32, 3, 3}};
  std::printf("%-10s %6s %12s %10s\n", "model", "batch", "input", "img/s");
  for (const Point& p : points) {
    const double ips = run(p);
    std::printf("%-10s %6lld %5lldx%lldx%lld %10.1f\n", p.model.c_str(), static_cast<long long>(p.batch),
                static_cast<long long>(p.image), static_cast<long long>(p.image), static_cast<long long>(p.channels), ips);
  }
  return 0;
}
