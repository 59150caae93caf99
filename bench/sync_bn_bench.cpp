// Cost of one SyncBatchNorm layer, forward + backward, at resnet18-cifar's BatchNorm shapes, through
// the synchronised path forced at world size 1 (sync_batch_norm called directly): the composition
// of generic ops it was (before, tests/dist/sync_bn_composed.h) against the fused kernels (after),
// with BatchNorm2d as the floor. Eager steps: the host launches every kernel, as in a run without
// dist.cuda_graph. Times are wall-clock per step over --iters steps after --warmup, the device
// synchronised at both ends. Built with the CUDA backend only (CMakeLists.txt).
//   build/sync_bn_bench                                   CPU, f32, batch 8 (a smoke test)
//   build/sync_bn_bench --device cuda --batch 128 --comm nccl
//   build/sync_bn_bench --device cuda --batch 128 --comm nccl --dtype bf16 --layout cl
// --comm single: SingleProcessComm (the all-reduce is free); nccl: a real one-rank NCCL communicator
// (--device cuda), so the all-reduce's launch and its stream handoff count as in a job.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "dist/nccl_comm.h"
#include "dist/store.h"
#include "dist/sync_batch_norm.h"
#include "nn/cuda/cuda_backend.h"
#include "nn/random.h"
#include "tests/dist/sync_bn_composed.h"

namespace {

using namespace trainer;
using Clock = std::chrono::steady_clock;
using Forward = std::function<Variable(BatchNorm2d&, const Variable&)>;

struct Options {
  std::string device = "cpu", comm = "single", dtype = "f32", layout = "nchw";
  int64_t batch = 8;
  int iters = 50, warmup = 10;
};

// resnet18-cifar's BatchNorm layers (3x3 stem without pooling, 32x32 input): channels, spatial size
// and how many layers of that shape one step runs (stem + 4 in layer1; 4 + the downsample's after).
struct Shape4 {
  int64_t channels, size;
  int layers;
};
constexpr Shape4 kResnet18Cifar[] = {{64, 32, 5}, {128, 16, 5}, {256, 8, 5}, {512, 4, 5}};

void sync_device(Device device) {
  if (device.is_cuda()) cuda_synchronize();
}

// Microseconds per forward + backward of `f` on one layer of `bn`.
double time_layer(BatchNorm2d& bn, const Forward& f, const Tensor& x, const Tensor& dy, const Options& o) {
  auto step = [&] {
    Variable xv(x, true);
    Variable y = f(bn, xv);
    y.backward(dy);
    bn.zero_grad();
  };
  for (int i = 0; i < o.warmup; ++i) step();
  sync_device(x.device());
  const auto start = Clock::now();
  for (int i = 0; i < o.iters; ++i) step();
  sync_device(x.device());
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count() / o.iters;
}

std::shared_ptr<Comm> make_comm(const Options& o, std::unique_ptr<Store>& store) {
  if (o.comm == "single") return std::make_shared<SingleProcessComm>();
  if (o.comm == "nccl" && o.device == "cuda") {
    TcpStoreOptions so;
    so.host = so.bind_host = "127.0.0.1";
    so.port = 0;  // any free port
    so.is_server = true;
    so.world_size = 1;
    auto tcp = std::make_unique<TcpStore>(so);
    NcclCommOptions no;
    no.device = 0;
    auto comm = NcclComm::create(*tcp, 0, 1, no);
    store = std::move(tcp);
    return comm;
  }
  std::fprintf(stderr, "sync_bn_bench: --comm %s needs --device cuda (or use single)\n", o.comm.c_str());
  std::exit(2);
}

int run(const Options& o) {
  Device device = Device::cpu();
  if (o.device == "cuda") {
    init_cuda_backend(0);
    device = Device::cuda(0);
  }
  const DType dtype = o.dtype == "bf16" ? DType::bf16 : o.dtype == "f16" ? DType::f16 : DType::f32;
  const MemoryFormat format = o.layout == "cl" ? MemoryFormat::channels_last : MemoryFormat::contiguous;
  std::unique_ptr<Store> store;
  const std::shared_ptr<Comm> comm = make_comm(o, store);
  const Forward plain = [](BatchNorm2d& bn, const Variable& x) { return bn.forward(x); };
  const Forward composed = [&](BatchNorm2d& bn, const Variable& x) {
    return composed_sync_batch_norm(bn, x, comm);
  };
  const Forward fused = [&](BatchNorm2d& bn, const Variable& x) { return sync_batch_norm(bn, x, comm); };

  std::printf(
      "sync_bn_bench: %s %s %s, batch %lld, comm %s, %d steps after %d warm-up; us per layer "
      "(forward + backward)\n",
      o.device.c_str(), o.dtype.c_str(), o.layout.c_str(), static_cast<long long>(o.batch),
      comm->backend_name().c_str(), o.iters, o.warmup);
  std::printf("%-20s %6s %12s %12s %12s %9s\n", "shape", "layers", "BatchNorm2d", "composed", "fused",
              "speed-up");
  Generator gen(1);
  double total[3] = {0, 0, 0};
  int layers = 0;
  for (const Shape4& s : kResnet18Cifar) {
    const Shape shape{o.batch, s.channels, s.size, s.size};
    Tensor x64 = Tensor::empty(shape, DType::f64), dy64 = Tensor::empty(shape, DType::f64);
    uniform_(x64, -1.0, 2.0, gen);
    uniform_(dy64, -1.0, 1.0, gen);
    Tensor x = Tensor::empty(shape, dtype, device, format), dy = Tensor::empty(shape, dtype, device, format);
    x.copy_(x64);
    dy.copy_(dy64);
    BatchNorm2d bn(s.channels);
    bn.to(device);
    double us[3];
    const Forward* forwards[] = {&plain, &composed, &fused};
    for (int i = 0; i < 3; ++i) us[i] = time_layer(bn, *forwards[i], x, dy, o);
    std::printf("%-20s %6d %12.1f %12.1f %12.1f %8.2fx\n", shape_str(shape).c_str(), s.layers, us[0], us[1],
                us[2], us[1] / us[2]);
    for (int i = 0; i < 3; ++i) total[i] += us[i] * s.layers;
    layers += s.layers;
  }
  std::printf("%-20s %6d %12.1f %12.1f %12.1f %8.2fx\n", "per step", layers, total[0], total[1], total[2],
              total[1] / total[2]);
  comm->shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--device")
      o.device = v;
    else if (k == "--comm")
      o.comm = v;
    else if (k == "--dtype")
      o.dtype = v;
    else if (k == "--layout")
      o.layout = v;
    else if (k == "--batch")
      o.batch = std::atoll(v.c_str());
    else if (k == "--iters")
      o.iters = std::atoi(v.c_str());
    else if (k == "--warmup")
      o.warmup = std::atoi(v.c_str());
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if ((argc - 1) % 2 != 0) {
    std::fprintf(stderr, "options come in pairs: --name value\n");
    return 2;
  }
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sync_bn_bench: %s\n", e.what());
    return 1;
  }
}
