// Forward + backward + SGD images/s of a model on synthetic data, on the CPU or a GPU; the same
// workload as bench/torch_reference.py, so the two run side by side on one machine.
//   build/nn_bench                                  cnn 28x28x1 and resnet18-cifar 32x32x3, batch 64, CPU
//   build/nn_bench --model resnet18 --image 32 --channels 3 --batch 512 --device cuda --math tf32 --layout cl
//   ... --device cuda --graph 1     times replays of one step captured as a CUDA graph
//   ... --device cuda --fusion 1    BatchNorm statistics in the convolutions' epilogues where faster
//                                   (train.cudnn_fusion; the device column then says "+fusion")
//   ... --device cuda --cudnn-bn-forward 0  BatchNorm's forward through our kernels only (the
//                                   default, as in the trainer, takes cuDNN's where it times faster)
//   ... --device cuda --cudnn-bn 0  BatchNorm's backward through our kernels instead of cuDNN's
//                                   (train.cudnn_batchnorm, on by default as in the trainer; where it
//                                   applies, bf16/fp16 on a GPU, the device column says "+cudnn-bn")
//   ... --device cuda --fused-attention 0  attention composed of bmm and softmax instead of cuDNN's
//                                   fused flash attention (on by default where it applies, bf16/fp16;
//                                   the device column then says "+composed-attn")
//   ... --device cuda --trace 5     then 5 more steps under CUPTI: GPU time per kernel, busy time, API calls
//   ... --optim adamw --classes 1000  AdamW (weight decay 0.05, none on norms/biases/embeddings) and a
//                                   1000-class head, as the ViT/ConvNeXt comparisons with torchvision
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench/trace/kernel_trace.h"
#include "dist/data_parallel_step.h"
#include "nn/amp/autocast.h"
#include "nn/amp/loss_scaler.h"
#include "nn/amp/precision_policy.h"
#include "nn/cpu/blas_kernels.h"
#include "nn/functional.h"
#include "nn/models/registry.h"
#include "nn/optim/adamw.h"
#include "nn/optim/sgd.h"
#include "nn/random.h"
#include "nn/runtime.h"

namespace {

using namespace trainer;

struct Point {
  std::string model;
  int64_t batch, image, channels;
  int iters;
  std::string device = "cpu";
  Precision math = Precision::fp32;  // autocast for bf16/fp16; fp16 with the loss scaler
  bool channels_last = false;
  std::string stem = "cifar";    // cifar | imagenet (torchvision's 7x7 stride-2 stem and max-pool)
  int trace_steps = 0;           // CUDA only: steps traced with CUPTI after the timed ones
  bool graph = false;            // CUDA only: capture one step as a CUDA graph and time its replays
  bool fusion = false;           // CUDA only: train.cudnn_fusion (nn/cuda/conv_stats_fusion.h)
  bool cudnn_bn = true;          // CUDA only: train.cudnn_batchnorm (nn/cuda/cudnn_batch_norm.h)
  bool cudnn_bn_forward = true;  // CUDA only: its forward too, where faster (as the trainer does)
  bool fused_attention = true;   // CUDA only: cuDNN's fused attention (nn/cuda/fused_attention.h)
  std::string optim = "sgd";     // sgd (momentum 0.9) | adamw (the ViT/ConvNeXt recipes' optimizer)
  int64_t classes = 10;          // 1000 for the ImageNet-shaped comparisons with torchvision
};

// The point's optimizer over the model's parameters.
std::unique_ptr<Optimizer> bench_optimizer(const Point& p, Module& model) {
  if (p.optim == "adamw") {
    AdamWOptions ao;
    ao.lr = 1e-3;
    ao.weight_decay = 0.05;
    ao.no_decay_bn_bias = true;
    return std::make_unique<AdamW>(model.named_parameters(), ao);
  }
  if (p.optim != "sgd") throw std::runtime_error("--optim is sgd or adamw, not '" + p.optim + "'");
  SgdOptions so;
  so.lr = 0.01;
  so.momentum = 0.9;
  return std::make_unique<Sgd>(model.named_parameters(), so);
}

// Whether cuDNN's batch norm runs in this point's backward (the backend takes it for half inputs only).
bool uses_cudnn_batch_norm(const Point& p) {
  return p.cudnn_bn && p.device == "cuda" && precision_policy_for(p.math).half();
}

struct Result {
  double images_per_second;
  double peak_mib;     // device memory; 0 on the CPU
  bool graph = false;  // the timed steps were replays of a CUDA graph
};

// The point's device, its backend set up as the point asks.
Device bench_device(const Point& p) {
  if (p.device == "cpu") return Device::cpu();
  if (p.device != "cuda") throw std::runtime_error("--device is cpu or cuda, not '" + p.device + "'");
  if (!runtime::cuda_built()) throw std::runtime_error("this build has no CUDA backend");
  runtime::init_device(0);
  runtime::apply_backend_options({.allow_tf32 = precision_policy_for(p.math).allow_tf32,
                                  .conv_stats_fusion = p.fusion,
                                  .cudnn_batch_norm = p.cudnn_bn,
                                  .cudnn_batch_norm_forward = p.cudnn_bn_forward,
                                  .fused_attention = p.fused_attention});
  return Device::cuda(0);
}

Result run(const Point& p) {
  const Device device = bench_device(p);
  ModelOptions m;
  m.name = p.model;
  if (model_has_stem_choice(p.model)) m.stem = p.stem;
  m.in_channels = p.channels;
  m.num_classes = p.classes;
  m.image_size = p.image;
  auto model = create_model(m);
  model->to(device);
  if (p.channels_last) model->to(MemoryFormat::channels_last);  // as the trainer (and torch_reference.py)
  model->train();
  std::unique_ptr<Optimizer> optimizer = bench_optimizer(p, *model);
  Optimizer& opt = *optimizer;
  Generator gen(1);
  Tensor x = Tensor::empty({p.batch, p.channels, p.image, p.image});
  normal_(x, 0, 1, gen);
  x = x.to(device).contiguous(p.channels_last ? MemoryFormat::channels_last : MemoryFormat::contiguous);
  std::vector<int64_t> labels(p.batch);
  for (auto& l : labels) l = static_cast<int64_t>(gen.below(static_cast<uint64_t>(p.classes)));
  Tensor y = Tensor::from_vector(labels, {p.batch}).to(device);
  const PrecisionPolicy precision = precision_policy_for(p.math);
  LossScalerOptions scaler_options;
  scaler_options.enabled = precision.loss_scaling;
  LossScaler scaler(scaler_options);
  const std::vector<Variable> params = model->parameters();
  // On a GPU the scaler decides on the device, as in the trainer (and capturable); PyTorch's GradScaler
  // reads its found-inf flag on the host every step.
  if (device.is_cuda() && scaler.enabled()) {
    scaler.keep_on_device(device);
    opt.skip_if(scaler.found_inf_flag());
  }
  // The trainer's step function (dist/data_parallel_step.h), as bench/torch_reference.py: autocast forward,
  // scaled backward, unscale + check, step. One process: nothing to reduce.
  const StepParts parts{.model = *model,
                        .optimizer = opt,
                        .scaler = scaler,
                        .params = params,
                        .autocast = precision.autocast,
                        .all_ranks_finite = {},
                        .agree_found_inf = {}};
  // The benchmark's one fixed batch feeds every step; the last loss is kept to wait for the device.
  const MicroBatchSource fixed_batch = [&](int) { return std::optional<StepInput>(StepInput{x, y}); };
  Tensor last_loss;
  auto step = [&] { last_loss = run_step(parts, fixed_batch, std::nullopt, nullptr).losses.back(); };
  for (int i = 0; i < 3; ++i) step();  // warm-up: allocator, algorithm search, BLAS threads
  (void)last_loss.item();              // waits for the device
  std::function<void()> timed = step;
  bool graph_used = false;
  // The peak covers a captured step too: the graph keeps what its step allocated.
  if (device.is_cuda()) runtime::reset_peak_device_memory();
  runtime::Graph graph;
  if (p.graph && device.is_cuda()) {
    // Momentum buffers and algorithm choices exist after the warm-up; the graph holds the rest.
    try {
      graph.capture(step);
      std::fprintf(stderr, "CUDA graph: %zu nodes\n", graph.nodes());
      timed = [&] { graph.replay(); };
      graph_used = true;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "CUDA graph: not captured, timing eager steps (%s)\n", e.what());
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < p.iters; ++i) timed();
  (void)last_loss.item();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Result r{p.batch * p.iters / s, 0.0, graph_used};
  if (device.is_cuda()) {
    const runtime::DeviceMemoryStats m = runtime::device_memory_stats();
    r.peak_mib = m.peak_allocated_bytes / 1048576.0;
    std::fprintf(stderr,
                 "memory: peak allocated %.0f MiB, peak reserved %.0f MiB, %lld cudaMalloc, %lld cudaFree\n",
                 m.peak_allocated_bytes / 1048576.0, m.peak_reserved_bytes / 1048576.0,
                 static_cast<long long>(m.device_mallocs), static_cast<long long>(m.device_frees));
    std::fprintf(stderr, "%s\n", runtime::convolution_summary().c_str());
    if (p.trace_steps > 0 && trace::start()) {
      const auto t1 = std::chrono::steady_clock::now();
      for (int i = 0; i < p.trace_steps; ++i) timed();
      const auto t2 = std::chrono::steady_clock::now();
      (void)last_loss.item();
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
      std::printf("host enqueue %.3f ms/step\n",
                  std::chrono::duration<double>(t2 - t1).count() * 1e3 / p.trace_steps);
      trace::report(p.trace_steps, wall);
    }
  }
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
    if (k == "--model")
      custom.model = v;
    else if (k == "--batch")
      custom.batch = std::atoll(v);
    else if (k == "--image")
      custom.image = std::atoll(v);
    else if (k == "--channels")
      custom.channels = std::atoll(v);
    else if (k == "--iters")
      custom.iters = std::atoi(v);
    else if (k == "--device")
      custom.device = v;
    else if (k == "--math") {
      const std::optional<Precision> math = parse_precision(v);
      if (!math) {
        std::fprintf(stderr, "--math: expected fp32, tf32, bf16 or fp16, got %s\n", v);
        return 2;
      }
      custom.math = *math;
    } else if (k == "--layout")
      custom.channels_last = std::string(v) == "cl";
    else if (k == "--stem")
      custom.stem = v;
    else if (k == "--graph")
      custom.graph = std::atoi(v) != 0;
    else if (k == "--fusion")
      custom.fusion = std::atoi(v) != 0;
    else if (k == "--cudnn-bn")
      custom.cudnn_bn = std::atoi(v) != 0;
    else if (k == "--cudnn-bn-forward")
      custom.cudnn_bn_forward = std::atoi(v) != 0;
    else if (k == "--fused-attention")
      custom.fused_attention = std::atoi(v) != 0;
    else if (k == "--optim")
      custom.optim = v;
    else if (k == "--classes")
      custom.classes = std::atoll(v);
    else if (k == "--trace")
      custom.trace_steps = std::atoi(v);
    else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (!custom.model.empty())
    points.push_back(custom);
  else
    points = {{"cnn", 64, 28, 1, 30}, {"resnet18", 64, 32, 3, 3}};
  std::printf("%-10s %6s %12s %10s %5s %6s %10s %10s\n", "model", "batch", "input", "device", "math",
              "layout", "img/s", "peak MiB");
  for (const Point& p : points) {
    try {
      const Result r = run(p);
      std::printf(
          "%-10s %6lld %5lldx%lldx%lld %10s %5s %6s %10.1f %10.0f\n", p.model.c_str(),
          static_cast<long long>(p.batch), static_cast<long long>(p.image), static_cast<long long>(p.image),
          static_cast<long long>(p.channels),
          (p.device + (r.graph ? "+graph" : "") + (p.fusion ? "+fusion" : "") +
           (uses_cudnn_batch_norm(p) ? "+cudnn-bn" : "") + (p.fused_attention ? "" : "+composed-attn"))
              .c_str(),
          std::string(precision_name(p.math)).c_str(), p.channels_last ? "cl" : "nchw", r.images_per_second,
          r.peak_mib);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "nn_bench: %s\n", e.what());
      return 1;
    }
  }
  return 0;
}
