// The weight average's multi-tensor kernel and timm's Lamb and Lars on the GPU against the CPU backend:
// a resnet18's whole state (more tensors than one launch takes, integer buffers among them), the
// every-N gate staged as under a CUDA graph and a device skip flag; Lamb and Lars over tensors large
// enough for many blocks' atomic norm sums; the average's update captured in a CUDA graph and replayed.
#include "nn/optim/ema.h"
#include "nn/optim/lamb.h"
#include "nn/optim/lars.h"
#include "nn/runtime.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainer {
namespace {

using namespace gpu_test;

std::shared_ptr<Module> cpu_model(uint64_t seed) {
  ModelOptions o;
  o.name = "resnet18";
  o.in_channels = 3;
  o.image_size = 32;
  o.num_classes = 10;
  o.stem = "cifar";
  o.seed = seed;
  return create_model(o);
}

// The same new values in both models' floating tensors and counters (the weights after an update).
void move_on(Module& a, Module& b, Generator& gen) {
  std::vector<NamedTensor> sa = a.state_dict(), sb = b.state_dict();
  for (size_t i = 0; i < sa.size(); ++i) {
    Tensor& ta = *sa[i].tensor;
    const Tensor values = ta.dtype() == DType::i64
                              ? Tensor::full(ta.shape(), static_cast<double>(gen.below(100)), DType::i64)
                              : random(ta.shape(), gen, ta.dtype());
    ta.copy_(values);
    sb[i].tensor->copy_(values);
  }
}

void expect_same_average(const ModelEma& cpu_ema, const ModelEma& gpu_ema, const std::string& what) {
  const auto c = cpu_ema.state_tensors(), g = gpu_ema.state_tensors();
  ASSERT_EQ(c.size(), g.size());
  for (size_t i = 0; i < c.size(); ++i)
    expect_close(c[i].second, g[i].second.to(Device::cpu()), 1e-6, 1e-7, what + " " + c[i].first);
}

TEST(CudaEma, WholeResnetStateMatchesTheCpuWithGateAndSkipFlag) {
  REQUIRE_GPU();
  auto host = cpu_model(3), device = gpu_model("resnet18", 3, 32, "cifar", 3);
  EmaOptions o;
  o.decay = 0.95, o.warmup = true, o.every_steps = 2;
  ModelEma cpu_ema(*host, o), gpu_ema(*device, o);
  Tensor cpu_flag = Tensor::zeros({1}, DType::i64), gpu_flag = Tensor::zeros({1}, DType::i64, gpu());
  Generator gen(7);
  for (int step = 1; step <= 9; ++step) {
    move_on(*host, *device, gen);
    const bool skip = step == 4;  // an update step the loss scaler skips
    cpu_flag.fill_(skip ? 1.0 : 0.0);
    gpu_flag.fill_(skip ? 1.0 : 0.0);
    if (step > 5) gpu_ema.stage_gate();  // the device decides every_steps from here, as under a graph
    cpu_ema.after_optimizer_step(false, cpu_flag.data<int64_t>());
    gpu_ema.after_optimizer_step(false, gpu_flag.data<int64_t>());
  }
  EXPECT_EQ(cpu_ema.updates(), 3);  // steps 2, 6, 8 (4 skipped)
  EXPECT_EQ(gpu_ema.updates(), 3);
  expect_same_average(cpu_ema, gpu_ema, "ema");
}

TEST(CudaEma, CapturedUpdateReplaysAsEagerUpdates) {
  REQUIRE_GPU();
  auto a = gpu_model("resnet18", 3, 32, "cifar", 5), b = gpu_model("resnet18", 3, 32, "cifar", 5);
  EmaOptions o;
  o.decay = 0.9, o.warmup = true, o.every_steps = 3;
  ModelEma eager(*a, o), graphed(*b, o);
  runtime::Graph graph;
  Generator gen(8);
  for (int step = 1; step <= 8; ++step) {
    move_on(*a, *b, gen);
    eager.after_optimizer_step(false, nullptr);
    graphed.stage_gate();
    if (!graph.captured()) {
      graph.capture([&] { graphed.after_optimizer_step(false, nullptr); });
      graph.replay();
    } else {
      graph.replay();
      graphed.count_replayed_step();
    }
  }
  EXPECT_EQ(graphed.steps(), 8);
  EXPECT_EQ(graphed.updates(), eager.updates());
  const auto e = eager.state_tensors(), g = graphed.state_tensors();
  for (size_t i = 0; i < e.size(); ++i)
    expect_equal(e[i].second.to(Device::cpu()), g[i].second.to(Device::cpu()), e[i].first);
}

// Three steps of an optimizer on the CPU and on the GPU from the same values.
template <class Opt, class Options>
void compare_steps(const Options& options, const std::string& what) {
  Generator gen(9);
  const std::vector<Shape> shapes = {{300, 257}, {257}, {64, 3, 3, 3}};
  std::vector<NamedParameter> host, device;
  const std::vector<std::string> names = {"w", "b", "k"};
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Tensor w = random(shapes[i], gen);
    host.push_back({names[i], Variable(w.clone(), true)});
    device.push_back({names[i], Variable(w.to(gpu()), true)});
  }
  Opt cpu_opt(host, options), gpu_opt(device, options);
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      const Tensor g = random(shapes[i], gen, DType::f32, -2.0, 2.0);
      host[i].param.grad() = g.clone();
      device[i].param.grad() = g.to(gpu());
    }
    cpu_opt.step();
    gpu_opt.step();
  }
  for (size_t i = 0; i < shapes.size(); ++i)
    expect_close(host[i].param.data(), device[i].param.data().to(Device::cpu()), 1e-5, 1e-6,
                 what + " " + host[i].name);
}

TEST(CudaLambLars, LambMatchesTheCpu) {
  REQUIRE_GPU();
  LambOptions o;
  o.lr = 0.01, o.weight_decay = 0.05, o.max_grad_norm = 1.0, o.no_decay_bn_bias = true;
  compare_steps<Lamb>(o, "lamb");
  o.max_grad_norm = 0.0, o.trust_clip = true;
  compare_steps<Lamb>(o, "lambc");
}

TEST(CudaLambLars, LarsMatchesTheCpu) {
  REQUIRE_GPU();
  LarsOptions o;
  o.lr = 0.5, o.weight_decay = 1e-4, o.momentum = 0.9, o.dampening = 0.1, o.no_decay_bn_bias = true;
  compare_steps<Lars>(o, "lars");
  o.dampening = 0.0, o.nesterov = true, o.trust_clip = true, o.lr = 0.002, o.trust_coeff = 0.02;
  compare_steps<Lars>(o, "larc");
}

}  // namespace
}  // namespace trainer
