// Forward + backward + SGD images/s of a model on synthetic data, on the CPU or a GPU; the same
// workload as bench/torch_reference.py, so the two run side by side on one machine.
//   build/nn_bench                                  cnn 28x28x1 and resnet18-cifar 32x32x3, batch 64, CPU
//   build/nn_bench --model resnet18 --image 32 --channels 3 --batch 512 --device cuda --math tf32 --layout cl
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
#ifdef TRAINER_WITH_CUDA
#include "nn/cuda/caching_allocator.h"
#include "nn/cuda/cuda_backend.h"
#endif

namespace {

using namespace trainer;

struct Point {
  std::string model;
  int64_t batch, image, channels;
  int iters;
  std::string device = "cpu";
  std::string math = "fp32";  // fp32 | tf32
  bool channels_last = false;
};

struct Result {
  double images_per_second;
  double peak_mib;  // device memory; 0 on the CPU
};

Result run(const Point& p) {
  Device device = Device::cpu();
#ifdef TRAINER_WITH_CUDA
  if (p.device == "cuda") {
    init_cuda_backend(0);
    cuda_set_allow_tf32(p.math == "tf32");
    device = Device::cuda(0);
  }
#endif
  if (p.device != "cpu" && device.is_cpu()) throw std::runtime_error("this build has no CUDA backend");
  ModelOptions m;
  m.name = p.model;
  m.stem = "cifar";
  m.in_channels = p.channels;
  m.num_classes = 10;
  m.image_size = p.image;
  auto model = create_model(m);
  model->to(device);
  model->train();
  SgdOptions so;
  so.lr = 0.01;
  so.momentum = 0.9;
  Sgd opt(model->named_parameters(), so);
  Generator gen(1);
  Tensor x = Tensor::empty({p.batch, p.channels, p.image, p.image});
  normal_(x, 0, 1, gen);
  x = x.to(device).contiguous(p.channels_last ? MemoryFormat::channels_last : MemoryFormat::contiguous);
  std::vector<int64_t> labels(p.batch);
  for (auto& l : labels) l = static_cast<int64_t>(gen.below(10));
  Tensor y = Tensor::from_vector(labels, {p.batch}).to(device);
  Variable last_loss;
  auto step = [&] {
    last_loss = F::cross_entropy((*model)(Variable(x)), y);
    last_loss.backward();
    opt.step();
    opt.zero_grad();
  };
  for (int i = 0; i < 3; ++i) step();  // warm-up: allocator, algorithm search, BLAS threads
  (void)last_loss.item();               // waits for the device
#ifdef TRAINER_WITH_CUDA
  if (device.is_cuda()) cuda_reset_peak_memory_stats();
#endif
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < p.iters; ++i) step();
  (void)last_loss.item();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Result r{p.batch * p.iters / s, 0.0};
#ifdef TRAINER_WITH_CUDA
  if (device.is_cuda()) r.peak_mib = cuda_memory_stats().peak_allocated_bytes / 1048576.0;
#endif
  return r;
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
    else if (k == "--device") custom.device = v;
    else if (k == "--math") custom.math = v;
    else if (k == "--layout") custom.channels_last = std::string(v) == "cl";
    else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (!custom.model.empty()) points.push_back(custom);
  else points = {{"cnn", 64, 28, 1, 30}, {"resnet18", 64, 32, 3, 3}};
  std::printf("%-10s %6s %12s %6s %5s %6s %10s %10s\n", "model", "batch", "input", "device", "math", "layout",
              "img/s", "peak MiB");
  for (const Point& p : points) {
    try {
      const Result r = run(p);
      std::printf("%-10s %6lld %5lldx%lldx%lld %6s %5s %6s %10.1f %10.0f\n", p.model.c_str(),
                  static_cast<long long>(p.batch), static_cast<long long>(p.image), static_cast<long long>(p.image),
                  static_cast<long long>(p.channels), p.device.c_str(), p.math.c_str(),
                  p.channels_last ? "cl" : "nchw", r.images_per_second, r.peak_mib);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "nn_bench: %s\n", e.what());
      return 1;
    }
  }
  return 0;
}
