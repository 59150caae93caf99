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
//   ... --device cuda --trace 5     then 5 more steps under CUPTI: GPU time per kernel, busy time, API calls
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dist/data_parallel_step.h"
#include "nn/amp/autocast.h"
#include "nn/amp/loss_scaler.h"
#include "nn/amp/precision_policy.h"
#include "nn/cpu/blas_kernels.h"
#include "nn/functional.h"
#include "nn/models/registry.h"
#include "nn/optim/sgd.h"
#include "nn/random.h"
#ifdef TRAINER_WITH_CUDA
#include <cupti.h>
#include <cxxabi.h>
#include <dlfcn.h>

#include <algorithm>
#include <map>
#include <memory>

#include "nn/cuda/caching_allocator.h"
#include "nn/cuda/conv_stats_fusion.h"
#include "nn/cuda/cuda_backend.h"
#include "nn/cuda/cuda_graph.h"
#include "nn/cuda/cudnn_batch_norm.h"
#endif

namespace {

using namespace trainer;

#ifdef TRAINER_WITH_CUDA
// A small Nsight-Systems substitute: CUPTI activity records of kernels, memcpys, memsets and runtime
// API calls, summed by name. libcupti is loaded at run time so that the bench runs without it.
namespace trace {

struct Stat {
  int64_t count = 0;
  uint64_t ns = 0;
};

struct Cupti {
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityDisable) disable = nullptr;
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&cuptiGetCallbackName) callback_name = nullptr;
};

Cupti g_api;
std::map<std::string, Stat> g_gpu, g_api_calls;
std::vector<std::pair<uint64_t, uint64_t>> g_busy;

// "trainer::CudaBackend::bn_apply" for our grid-stride lambdas; the kernel name, shortened, otherwise.
std::string short_name(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(mangled, nullptr, nullptr, &status),
                                           std::free);
  std::string n = status == 0 && d ? d.get() : mangled;
  for (size_t a; (a = n.find("(anonymous namespace)::")) != std::string::npos;) n.erase(a, 23);
  const size_t fe = n.find("for_each_kernel<");
  if (fe != std::string::npos) {
    const size_t t = n.find("trainer::", fe + 16);
    if (t != std::string::npos) {
      size_t e = n.find('(', t);
      std::string fn = n.substr(t, e - t);
      if (fn.find("{lambda") != std::string::npos) fn = fn.substr(0, fn.find("::{lambda"));
      return "for_each " + fn;
    }
  }
  const size_t cut = n.find('(');
  if (cut != std::string::npos && cut > 0) n = n.substr(0, cut);
  return n.size() > 110 ? n.substr(0, 110) : n;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = size_t{16} << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  while (g_api.next_record(buffer, valid, &rec) == CUPTI_SUCCESS) {
    auto gpu = [](const std::string& name, uint64_t start, uint64_t end) {
      Stat& s = g_gpu[name];
      ++s.count;
      s.ns += end - start;
      g_busy.emplace_back(start, end);
    };
    if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      gpu(short_name(k->name), k->start, k->end);
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
      gpu("[memcpy kind " + std::to_string(m->copyKind) + "]", m->start, m->end);
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
      gpu("[memset]", m->start, m->end);
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME || rec->kind == CUPTI_ACTIVITY_KIND_DRIVER) {
      const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(rec);
      const char* name = nullptr;
      g_api.callback_name(
          rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API,
          a->cbid, &name);
      Stat& s = g_api_calls[name ? name : "?"];
      ++s.count;
      s.ns += a->end - a->start;
    }
  }
  std::free(buffer);
}

const CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                     CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_RUNTIME};

bool start() {
  void* lib = dlopen("libcupti.so.13", RTLD_NOW);
  if (!lib) lib = dlopen("libcupti.so", RTLD_NOW);
  if (!lib) {
    std::fprintf(stderr, "nn_bench: --trace needs libcupti: %s\n", dlerror());
    return false;
  }
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::decay_t<decltype(fn)>>(dlsym(lib, name));
  };
  sym(g_api.enable, "cuptiActivityEnable");
  sym(g_api.disable, "cuptiActivityDisable");
  sym(g_api.register_callbacks, "cuptiActivityRegisterCallbacks");
  sym(g_api.flush_all, "cuptiActivityFlushAll");
  sym(g_api.next_record, "cuptiActivityGetNextRecord");
  sym(g_api.callback_name, "cuptiGetCallbackName");
  if (!g_api.enable || !g_api.register_callbacks || !g_api.next_record || !g_api.callback_name) return false;
  if (g_api.register_callbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) return false;
  for (CUpti_ActivityKind k : kKinds)
    if (g_api.enable(k) != CUPTI_SUCCESS) return false;
  return true;
}

void report(int steps, double wall_s) {
  g_api.flush_all(1);
  for (CUpti_ActivityKind k : kKinds) g_api.disable(k);
  std::sort(g_busy.begin(), g_busy.end());
  uint64_t busy = 0, end = 0;
  for (auto [b, e] : g_busy) {
    if (b >= end)
      busy += e - b;
    else if (e > end)
      busy += e - end;
    end = std::max(end, e);
  }
  auto print = [&](const char* title, const std::map<std::string, Stat>& m, size_t top) {
    std::vector<std::pair<std::string, Stat>> v(m.begin(), m.end());
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
    uint64_t total = 0;
    int64_t count = 0;
    for (const auto& [n, s] : v) total += s.ns, count += s.count;
    std::printf("  %s: %.0f calls/step, %.3f ms/step\n", title, double(count) / steps, total / 1e6 / steps);
    for (size_t i = 0; i < std::min(top, v.size()); ++i)
      std::printf("    %8.3f ms %6.1f/step  %s\n", v[i].second.ns / 1e6 / steps,
                  double(v[i].second.count) / steps, v[i].first.c_str());
  };
  std::printf("trace over %d steps: wall %.3f ms/step, GPU busy %.3f ms/step\n", steps, wall_s * 1e3 / steps,
              busy / 1e6 / steps);
  print("GPU work", g_gpu, 45);
  print("runtime API", g_api_calls, 12);
}

}  // namespace trace
#endif

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
};

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
  Device device = Device::cpu();
#ifdef TRAINER_WITH_CUDA
  if (p.device == "cuda") {
    init_cuda_backend(0);
    cuda_set_allow_tf32(precision_policy_for(p.math).allow_tf32);
    cuda::set_conv_stats_fusion(p.fusion ? cuda::ConvStatsFusion::where_faster : cuda::ConvStatsFusion::off);
    cuda::set_cudnn_batch_norm(p.cudnn_bn);
    cuda::set_cudnn_batch_norm_forward(p.cudnn_bn_forward);
    device = Device::cuda(0);
  }
#endif
  if (p.device != "cpu" && device.is_cpu()) throw std::runtime_error("this build has no CUDA backend");
  return device;
}

Result run(const Point& p) {
  const Device device = bench_device(p);
  ModelOptions m;
  m.name = p.model;
  m.stem = p.stem;
  m.in_channels = p.channels;
  m.num_classes = 10;
  m.image_size = p.image;
  auto model = create_model(m);
  model->to(device);
  if (p.channels_last) model->to(MemoryFormat::channels_last);  // as the trainer (and torch_reference.py)
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
#ifdef TRAINER_WITH_CUDA
  // The peak covers a captured step too: the graph keeps what its step allocated.
  if (device.is_cuda()) cuda_reset_peak_memory_stats();
  cuda::CudaGraph graph;
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
#endif
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < p.iters; ++i) timed();
  (void)last_loss.item();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Result r{p.batch * p.iters / s, 0.0, graph_used};
#ifdef TRAINER_WITH_CUDA
  if (device.is_cuda()) {
    const CudaMemoryStats m = cuda_memory_stats();
    r.peak_mib = m.peak_allocated_bytes / 1048576.0;
    std::fprintf(stderr,
                 "memory: peak allocated %.0f MiB, peak reserved %.0f MiB, %lld cudaMalloc, %lld cudaFree\n",
                 m.peak_allocated_bytes / 1048576.0, m.peak_reserved_bytes / 1048576.0,
                 static_cast<long long>(m.device_mallocs), static_cast<long long>(m.device_frees));
    std::fprintf(stderr, "%s\n", cuda_conv_summary().c_str());
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
      std::printf("%-10s %6lld %5lldx%lldx%lld %10s %5s %6s %10.1f %10.0f\n", p.model.c_str(),
                  static_cast<long long>(p.batch), static_cast<long long>(p.image),
                  static_cast<long long>(p.image), static_cast<long long>(p.channels),
                  (p.device + (r.graph ? "+graph" : "") + (p.fusion ? "+fusion" : "") +
                   (uses_cudnn_batch_norm(p) ? "+cudnn-bn" : ""))
                      .c_str(),
                  std::string(precision_name(p.math)).c_str(), p.channels_last ? "cl" : "nchw",
                  r.images_per_second, r.peak_mib);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "nn_bench: %s\n", e.what());
      return 1;
    }
  }
  return 0;
}
