#include "nn/cuda/conv_stats_fusion.h"

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "nn/cuda/conv_stats_graph.h"
#include "nn/cuda/cuda_backend.h"
#include "nn/cuda/cuda_common.h"
#include "nn/fusion_hints.h"

namespace trainer::cuda {
namespace {

using namespace conv_stats;

constexpr double kRequiredGain = 0.97;                 // fused time / ours, at most
constexpr int64_t kMaxWorkspace = int64_t{256} << 20;  // as the convolutions' floor
std::atomic<int64_t> g_fused{0}, g_from_sums{0};

// The sums of the last fused convolution, with its output (held, so its storage cannot be reused for
// another tensor before a BatchNorm takes them).
struct Kept {
  Tensor y;
  ChannelSums sums;
};
thread_local std::optional<Kept> t_kept;

// The decision for one convolution shape: whether to fuse, and the plan that does, kept with the
// operation graph and engine configuration it was made from (as the convolutions' plans are).
struct Decision {
  std::atomic<bool> fuse{false};
  std::optional<Plan> plan;
  OpGraph graph;
  cudnn_graph::BackendDesc config;
};
using Key = std::array<int64_t, 16>;
std::mutex g_mutex;
// Never shrinks and is never destroyed (cuDNN may be gone at exit): the plans live as long as the process.
std::map<Key, std::unique_ptr<Decision>>& g_decisions = *new std::map<Key, std::unique_ptr<Decision>>();

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

bool applies(const Tensor& x, const Tensor& w, bool has_bias, const Conv2dParams& p, const Shape& ys) {
  const DType dt = x.dtype();
  return !has_bias && (dt == DType::bf16 || dt == DType::f16) && w.dtype() == dt && p.groups == 1 &&
         ys[1] % 4 == 0 && x.numel() > 0 && shape_numel(ys) > 0 &&
         x.suggest_memory_format() == MemoryFormat::channels_last &&
         x.is_contiguous(MemoryFormat::channels_last) && aligned16(x.raw_data());
}

// The shape, and the mode the decision was made under (`always` skips the timing).
Key key_of(const Tensor& x, const Tensor& w, const Conv2dParams& p, ConvStatsFusion mode) {
  Key k{};
  size_t i = 0;
  k[i++] = static_cast<int64_t>(x.dtype());
  k[i++] = static_cast<int64_t>(mode);
  for (const Shape* shape : {&x.shape(), &w.shape()})
    for (int64_t d : *shape) k[i++] = d;
  for (int v : {p.stride_h, p.stride_w, p.pad_h, p.pad_w, p.dilation_h, p.dilation_w}) k[i++] = v;
  return k;
}

// Runs the fused plan: y and the sums (zeroed first: [sum | sqsum], 2C f32).
void run(const Plan& plan, const Tensor& x, const Tensor& w, Tensor& y, Tensor& sums) {
  const int64_t C = y.size(1);
  CUDA_CHECK(cudaMemsetAsync(sums.raw_data(), 0, static_cast<size_t>(2 * C) * sizeof(float), cuda_stream()));
  Tensor ws = Tensor::empty({std::max<int64_t>(plan.workspace_bytes, 1)}, DType::u8, current_device());
  float* s = static_cast<float*>(sums.raw_data());
  const std::vector<void*> ptrs{x.raw_data(), w.raw_data(), y.raw_data(), s, s + C};
  if (!plan.execute(pack_uids(Pattern::reduction), ptrs, ws.raw_data()))
    throw std::runtime_error(
        "cuDNN fused convolution + statistics failed to run after it ran at start-up (TRAINER_CUDNN_DEBUG=1 "
        "names the call). HINT: set train.cudnn_fusion = false");
}

// The first call of a shape: the fastest fused engine, timed against `plain` + our statistics.
std::unique_ptr<Decision> decide(const Tensor& x, const Tensor& w, const Conv2dParams& p, const Shape& ys,
                                 const std::function<Tensor()>& plain, ConvStatsFusion mode) {
  auto d = std::make_unique<Decision>();
  d->graph = build(Pattern::reduction, cuda_context().cudnn, x.dtype(), x.shape(), w.shape(), ys, p);
  if (!d->graph.graph) return d;
  Tensor y = empty(ys, x.dtype(), MemoryFormat::channels_last);
  Tensor sums = empty({2 * ys[1]}, DType::f32);
  float best_ms = std::numeric_limits<float>::infinity();
  std::set<int64_t> seen;
  for (cudnnBackendHeurMode_t heur : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    for (cudnn_graph::BackendDesc& cfg : cudnn_graph::engine_configs(d->graph.graph.get(), heur)) {
      const cudnn_graph::EngineInfo info = cudnn_graph::engine_info(cfg.get());
      // The fused engine computes y too: the same numerics rule as every convolution (conv.cpp).
      if (!info.known || info.reduced_precision || !seen.insert(info.index).second) continue;
      std::optional<Plan> plan = finalize_plan(cfg.get(), kMaxWorkspace);  // compiles its kernel
      if (!plan) continue;
      const float ms = time_per_call_ms(
          [&] {
            try {
              run(*plan, x, w, y, sums);
              return true;
            } catch (const std::runtime_error&) {
              return false;
            }
          },
          10, 2);
      cudaGetLastError();
      if (ms < best_ms) {
        best_ms = ms;
        d->plan = std::move(plan);
        d->config = std::move(cfg);
      }
    }
  }
  if (!d->plan) return d;
  float ours_ms = std::numeric_limits<float>::infinity();
  if (mode == ConvStatsFusion::always) {
    d->fuse = true;
  } else {
    Backend& k = backend_for(y);
    ours_ms = time_per_call_ms(
        [&] {
          const Tensor out = plain();
          k.bn_mean_var(out);
          return true;
        },
        10, 2);
    d->fuse = best_ms <= kRequiredGain * ours_ms;
  }
  if (cudnn_graph::debug())
    std::fprintf(stderr, "cudnn fusion: conv %s x %s: fused %.4f ms, conv + statistics %.4f ms: %s\n",
                 shape_str(x.shape()).c_str(), shape_str(w.shape()).c_str(), best_ms, ours_ms,
                 d->fuse ? "fused" : "not fused");
  return d;
}

}  // namespace

ConvStatsFusion conv_stats_fusion() {
  const runtime::BackendOptions& o = cuda_options();
  return o.force_conv_stats_fusion ? ConvStatsFusion::always
         : o.conv_stats_fusion     ? ConvStatsFusion::where_faster
                                   : ConvStatsFusion::off;
}
int64_t fused_convolutions() { return g_fused; }
int64_t batch_norms_from_sums() { return g_from_sums; }

std::optional<Tensor> conv2d_with_channel_sums(const Tensor& x, const Tensor& w_in, bool has_bias,
                                               const Conv2dParams& p, const Shape& ys,
                                               const std::function<Tensor()>& plain) {
  t_kept.reset();
  const ConvStatsFusion mode = conv_stats_fusion();
  if (mode == ConvStatsFusion::off || cuda_deterministic() || !ConvFeedsBatchNormStats::active() ||
      !applies(x, w_in, has_bias, p, ys))
    return std::nullopt;
  const Tensor w = w_in.contiguous(MemoryFormat::channels_last);
  if (!aligned16(w.raw_data())) return std::nullopt;  // this call only: not a decision about the shape
  Decision* d = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_decisions.find(key_of(x, w, p, mode));
    if (it != g_decisions.end()) d = it->second.get();
  }
  if (!d) {
    // Compiling and timing inside a CUDA graph capture is impossible: a shape first seen there runs
    // unfused (the trainer's captured step always had an eager warm-up of its shape).
    if (cuda_stream_capturing()) return std::nullopt;
    std::unique_ptr<Decision> made = decide(x, w, p, ys, plain, mode);
    std::lock_guard<std::mutex> lock(g_mutex);
    d = g_decisions.emplace(key_of(x, w, p, mode), std::move(made)).first->second.get();
  }
  if (!d->fuse) return std::nullopt;
  Tensor y = empty(ys, x.dtype(), MemoryFormat::channels_last);
  Tensor sums = empty({2 * ys[1]}, DType::f32);
  if (!aligned16(y.raw_data()) || !aligned16(sums.raw_data())) return std::nullopt;
  try {
    run(*d->plan, x, w, y, sums);
  } catch (const std::runtime_error& e) {
    // It ran when the shape was decided; if it stops running, the shape goes back to the usual path.
    std::fprintf(stderr, "trainer: warning: %s; this convolution shape runs unfused from now on\n", e.what());
    cudaGetLastError();
    d->fuse = false;
    return std::nullopt;
  }
  ++g_fused;
  const int64_t C = ys[1];
  t_kept = Kept{y, ChannelSums{sums.slice(0, 0, C), sums.slice(0, C, 2 * C), ys[0] * ys[2] * ys[3]}};
  return y;
}

std::optional<ChannelSums> take_channel_sums(const Tensor& y) {
  if (!t_kept) return std::nullopt;
  const Tensor& kept = t_kept->y;
  if (y.raw_data() != kept.raw_data() || y.dtype() != kept.dtype() || y.shape() != kept.shape() ||
      y.strides() != kept.strides())
    return std::nullopt;
  ChannelSums sums = std::move(t_kept->sums);
  t_kept.reset();
  ++g_from_sums;
  return sums;
}

}  // namespace trainer::cuda
