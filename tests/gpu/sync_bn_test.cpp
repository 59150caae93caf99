// SyncBatchNorm's fused kernels (Backend::sync_bn_*) on the GPU against the CPU backend, in every
// layout and dtype (the channels-last 16-byte reduction included); the whole layer, forced at world
// size 1, against the CPU and against the composed path it replaced; and the layer with a real
// one-rank NCCL communicator captured in a CUDA graph: replays equal eager steps bit for bit, and
// the graph holds a fraction of the composed path's nodes.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <string>

#include "dist/sync_batch_norm.h"
#include "nn/cuda/cuda_graph.h"
#include "nn/functional.h"
#include "tests/dist/sync_bn_composed.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/nccl_test_util.h"

namespace trainer {
namespace {

using namespace gpu_test;

constexpr double kEps = 1e-5, kMomentum = 0.1;

struct Case {
  Shape shape;
  MemoryFormat format;
  double offset;  // added to every value: |mean| >> std at 1000
};

const Case kCases[] = {{{8, 6, 7, 5}, MemoryFormat::contiguous, 0.0},
                       {{8, 6, 7, 5}, MemoryFormat::channels_last, 0.0},
                       {{16, 3, 30, 30}, MemoryFormat::contiguous, 1000.0},
                       {{16, 70, 9, 9}, MemoryFormat::channels_last, 1000.0},
                       // channels-last with C a multiple of 4: the 16-byte-load reduction
                       {{32, 64, 6, 6}, MemoryFormat::channels_last, 1000.0},
                       {{128, 256, 4, 4}, MemoryFormat::channels_last, 0.5},
                       {{32, 64, 16, 16}, MemoryFormat::contiguous, 0.5}};

std::string name_of(const Case& c, DType dtype) {
  return std::string(dtype_name(dtype)) + " " + shape_str(c.shape) +
         (c.format == MemoryFormat::channels_last ? " nhwc" : "");
}

TEST(CudaSyncBn, KernelsMatchTheCpu) {
  REQUIRE_GPU();
  Generator gen(41);
  for (DType dtype : {DType::f32, DType::f64})
    for (const Case& c : kCases) {
      const std::string what = name_of(c, dtype);
      const int64_t C = c.shape[1];
      const Tensor x = random(c.shape, gen, DType::f64, c.offset - 1.0, c.offset + 1.0).to(dtype);
      const Tensor xg = on_gpu(x, c.format);
      const double n = static_cast<double>(x.numel() / C);
      // Both backends sum in double: they differ by rounding only, relative to sum |x| (or sum x^2).
      Tensor packed = Tensor::empty({2 * C + 1}, DType::f64),
             packed_g = Tensor::empty({2 * C + 1}, DType::f64, gpu());
      cpu().sync_bn_local_stats(x, packed);
      dev().sync_bn_local_stats(xg, packed_g);
      const double scale = n * (std::abs(c.offset) + 1.0);
      expect_close(packed.slice(0, 0, C), packed_g.slice(0, 0, C).to(Device::cpu()), 1e-12, 1e-12 * scale,
                   what + " sum x");
      expect_close(packed.slice(0, C, 2 * C + 1), packed_g.slice(0, C, 2 * C + 1).to(Device::cpu()), 1e-12,
                   1e-12 * scale * scale / n, what + " sum x^2 and count");

      // The statistics from the same sums: the same double arithmetic, rounded the same way.
      Tensor rm = random({C}, gen, DType::f32), rv = random({C}, gen, DType::f32, 0.5, 1.5);
      Tensor rm_g = rm.to(gpu()), rv_g = rv.to(gpu());
      const auto [mean, invstd] = cpu().sync_bn_global_stats(packed, dtype, kEps, kMomentum, rm, rv);
      const auto [mean_g, invstd_g] =
          dev().sync_bn_global_stats(packed.to(gpu()), dtype, kEps, kMomentum, rm_g, rv_g);
      EXPECT_EQ(mean_g.dtype(), dtype);
      // mean = sum / n alike; var = E[x^2] - mean^2 may be contracted into an FMA on the GPU, a
      // difference of 1e-16 * mean^2 / var relative (3e-10 at |mean| = 1000, std 0.6).
      const double tol = dtype == DType::f32 ? 2e-7 : 1e-14;
      expect_close(mean, mean_g, tol, 0.0, what + " mean");
      expect_close(invstd, invstd_g, dtype == DType::f32 ? 2e-7 : 1e-9, 0.0, what + " invstd");
      expect_close(rm, rm_g, 2e-7, 0.0, what + " running_mean");
      expect_close(rv, rv_g, 2e-7, 0.0, what + " running_var");

      const Tensor dy = random(c.shape, gen, dtype);
      Tensor sums = Tensor::empty({2 * C}, DType::f64), sums_g = Tensor::empty({2 * C}, DType::f64, gpu());
      const auto [sdy, sdyx] = cpu().sync_bn_local_grad_sums(dy, x, mean, invstd, packed, sums);
      const auto [sdy_g, sdyx_g] = dev().sync_bn_local_grad_sums(on_gpu(dy, c.format), xg, mean.to(gpu()),
                                                                 invstd.to(gpu()), packed.to(gpu()), sums_g);
      const double terms = std::sqrt(n);  // sums of ~n random terms
      const double rtol = dtype == DType::f32 ? 2e-5 : 1e-11;
      expect_close(sdy, sdy_g, rtol, rtol * terms, what + " sum_dy");
      expect_close(sdyx, sdyx_g, rtol, rtol * terms * 10, what + " sum_dy_xhat");
      // bn_backward_reduce's sums exactly (the same reduction and rounding).
      const auto [rdy_g, rdyx_g] =
          dev().bn_backward_reduce(on_gpu(dy, c.format), xg, mean.to(gpu()), invstd.to(gpu()), Tensor());
      expect_equal(rdy_g.to(Device::cpu()), sdy_g.to(Device::cpu()), what + " sum_dy = bn_backward_reduce's");
      expect_equal(rdyx_g.to(Device::cpu()), sdyx_g.to(Device::cpu()),
                   what + " sum_dy_xhat = bn_backward_reduce's");
      expect_close(sums, sums_g.to(Device::cpu()), rtol, rtol * terms * 10 / n, what + " packed means");
    }
}

TEST(CudaSyncBn, HalfInputsAgainstF32) {
  REQUIRE_GPU();
  Generator gen(42);
  for (DType dtype : {DType::f16, DType::bf16}) {
    const Tensor x = random({16, 64, 6, 6}, gen, dtype, -2.0, 3.0);
    const Tensor xg = on_gpu(x, MemoryFormat::channels_last);
    const int64_t C = 64;
    Tensor packed = Tensor::empty({2 * C + 1}, DType::f64),
           packed_g = Tensor::empty({2 * C + 1}, DType::f64, gpu());
    cpu().sync_bn_local_stats(as_f32(x), packed);
    dev().sync_bn_local_stats(xg, packed_g);
    // The 16-byte reduction sums a thread's half values in f32 (shifted): ~1e-7 of the sums.
    expect_close(packed, packed_g.to(Device::cpu()), 1e-6, 1e-3, std::string(dtype_name(dtype)) + " sums");
    Tensor rm, rv;
    const auto [mean_g, invstd_g] = dev().sync_bn_global_stats(packed_g, DType::f32, kEps, kMomentum, rm, rv);
    EXPECT_EQ(mean_g.dtype(), DType::f32);
    const auto [mean, invstd] = cpu().bn_train_stats(as_f32(x), kEps, kMomentum, rm, rv);
    expect_close(mean, mean_g, 1e-5, 1e-6, std::string(dtype_name(dtype)) + " mean");
    expect_close(invstd, invstd_g, 1e-5, 1e-6, std::string(dtype_name(dtype)) + " invstd");
  }
}

using Forward = std::function<Variable(BatchNorm2d&, const Variable&)>;

// A layer's training step, loss = sum(y * r); results copied into `out` (y, grad_x, grad_weight,
// grad_bias), tensors the caller keeps, so that a captured step writes them on every replay.
void layer_step(BatchNorm2d& bn, const Forward& f, const Tensor& x, const Tensor& r,
                std::vector<Tensor>& out) {
  Variable xv(x, true);
  Variable y = f(bn, xv);
  F::sum(F::mul(y, Variable(r))).backward();
  const Tensor results[] = {y.data(), xv.grad(), bn.weight().grad(), bn.bias().grad()};
  if (out.empty())
    for (const Tensor& t : results)
      out.push_back(Tensor::empty(t.shape(), t.dtype(), t.device(), t.suggest_memory_format()));
  for (size_t i = 0; i < out.size(); ++i) out[i].copy_(results[i]);
  bn.zero_grad();
}

std::shared_ptr<BatchNorm2d> layer(int64_t C, Device device) {
  auto bn = std::make_shared<BatchNorm2d>(C);
  Generator gen(43);
  bn->weight().data().copy_(random({C}, gen, DType::f32, 0.5, 1.5));
  bn->bias().data().copy_(random({C}, gen));
  bn->running_mean().copy_(random({C}, gen));
  bn->to(device);
  return bn;
}

// The layer forced through the synchronised path at world size 1, on the GPU: as on the CPU, as the
// composed path on the GPU, and as BatchNorm2d on the GPU.
TEST(CudaSyncBn, LayerAtWorldSizeOneMatchesTheCpuTheComposedPathAndBatchNorm2d) {
  REQUIRE_GPU();
  const auto single = std::make_shared<SingleProcessComm>();
  const Forward fused = [&](BatchNorm2d& bn, const Variable& x) { return sync_batch_norm(bn, x, single); };
  const Forward composed = [&](BatchNorm2d& bn, const Variable& x) {
    return composed_sync_batch_norm(bn, x, single);
  };
  const Forward plain = [](BatchNorm2d& bn, const Variable& x) { return bn.forward(x); };
  Generator gen(44);
  for (MemoryFormat f : {MemoryFormat::contiguous, MemoryFormat::channels_last}) {
    const int64_t C = 64;
    auto cpu_bn = layer(C, Device::cpu());
    auto gpu_bn = layer(C, gpu()), composed_bn = layer(C, gpu()), plain_bn = layer(C, gpu());
    for (int s = 0; s < 2; ++s) {
      const Tensor x = random({16, C, 8, 8}, gen, DType::f32, -1.0, 2.0), r = random({16, C, 8, 8}, gen);
      const Tensor xg = on_gpu(x, f), rg = on_gpu(r, f);
      std::vector<Tensor> want, got, got_composed, got_plain;
      layer_step(*cpu_bn, fused, x, r, want);
      layer_step(*gpu_bn, fused, xg, rg, got);
      layer_step(*composed_bn, composed, xg, rg, got_composed);
      layer_step(*plain_bn, plain, xg, rg, got_plain);
      const char* names[] = {"y", "grad_x", "grad_weight", "grad_bias"};
      for (size_t i = 0; i < want.size(); ++i) {
        const std::string what = std::string(names[i]) + " step " + std::to_string(s);
        expect_close(want[i], got[i].to(Device::cpu()), 1e-5, 1e-5, what + " against the CPU");
        expect_close(got_composed[i].to(Device::cpu()), got[i].to(Device::cpu()), 1e-5, 1e-5,
                     what + " against the composed path");
        expect_close(got_plain[i].to(Device::cpu()), got[i].to(Device::cpu()), 1e-5, 1e-5,
                     what + " against BatchNorm2d");
      }
      expect_close(cpu_bn->running_mean(), gpu_bn->running_mean().to(Device::cpu()), 1e-6, 1e-6,
                   "running_mean");
      expect_close(cpu_bn->running_var(), gpu_bn->running_var().to(Device::cpu()), 1e-6, 1e-6, "running_var");
      expect_close(plain_bn->running_var().to(Device::cpu()), gpu_bn->running_var().to(Device::cpu()), 1e-6,
                   1e-6, "running_var against BatchNorm2d");
    }
  }
}

class NcclSyncBn : public OneRankNcclTest {
 protected:
  NcclSyncBn() : OneRankNcclTest(/*watchdog_store=*/false) {}
};

// Forward and backward of one layer through a real NCCL communicator (world size 1, the synchronised
// path forced), eager and captured: every replay gives the eager step's outputs, gradients and running
// statistics bit for bit. A host wait or a forbidden allocation would make the capture throw.
TEST_F(NcclSyncBn, CapturedLayerReplaysTheEagerStepsBitwise) {
  const Forward fused = [comm = std::shared_ptr<Comm>(comm_)](BatchNorm2d& bn, const Variable& x) {
    return sync_batch_norm(bn, x, comm);
  };
  for (DType dtype : {DType::f32, DType::bf16}) {
    const MemoryFormat f = dtype == DType::bf16 ? MemoryFormat::channels_last : MemoryFormat::contiguous;
    const std::string what = std::string(dtype_name(dtype)) + " ";
    const int64_t C = 128;
    auto eager_bn = layer(C, gpu()), graph_bn = layer(C, gpu());
    Generator gen(45);
    Tensor x = on_gpu(random({32, C, 8, 8}, gen, dtype), f), r = on_gpu(random({32, C, 8, 8}, gen, dtype), f);
    std::vector<Tensor> eager_out, graph_out;
    cuda::CudaGraph graph;
    for (int s = 0; s < 5; ++s) {
      x.copy_(random(x.shape(), gen, dtype, -1.0, 2.0));
      r.copy_(random(r.shape(), gen, dtype));
      layer_step(*eager_bn, fused, x, r, eager_out);
      if (s == 1) graph.capture([&] { layer_step(*graph_bn, fused, x, r, graph_out); });
      if (graph.captured()) {
        graph.replay();
        comm_->watch_graph_replay("sync_bn layer");
      } else {
        layer_step(*graph_bn, fused, x, r, graph_out);
      }
      for (size_t i = 0; i < eager_out.size(); ++i)
        expect_equal(eager_out[i].to(Device::cpu()), graph_out[i].to(Device::cpu()),
                     what + "output " + std::to_string(i) + " step " + std::to_string(s));
      expect_equal(eager_bn->running_mean().to(Device::cpu()), graph_bn->running_mean().to(Device::cpu()),
                   what + "running_mean step " + std::to_string(s));
      expect_equal(eager_bn->running_var().to(Device::cpu()), graph_bn->running_var().to(Device::cpu()),
                   what + "running_var step " + std::to_string(s));
    }
    EXPECT_TRUE(graph.captured());
  }
}

// The graph of one layer's step holds the kernels and copies it launches: the fused path's must be a
// fraction of the composed one's (both captured with the same loss and gradient bookkeeping).
TEST_F(NcclSyncBn, TheFusedLayerLaunchesAFractionOfTheComposedOnesKernels) {
  const std::shared_ptr<Comm> comm = comm_;
  const Forward fused = [comm](BatchNorm2d& bn, const Variable& x) { return sync_batch_norm(bn, x, comm); };
  const Forward composed = [comm](BatchNorm2d& bn, const Variable& x) {
    return composed_sync_batch_norm(bn, x, comm);
  };
  Generator gen(46);
  const int64_t C = 64;
  const Tensor x = on_gpu(random({32, C, 8, 8}, gen)), r = on_gpu(random({32, C, 8, 8}, gen));
  auto nodes = [&](const Forward& f) {
    auto bn = layer(C, gpu());
    std::vector<Tensor> out;
    layer_step(*bn, f, x, r, out);  // eager first: the gradients and outputs exist before the capture
    cuda::CudaGraph graph;
    graph.capture([&] { layer_step(*bn, f, x, r, out); });
    graph.replay();  // and watched: the communicator then lets go of the capture's tensors
    comm_->watch_graph_replay("sync_bn layer");
    cuda_synchronize();
    return graph.nodes();
  };
  const size_t fused_nodes = nodes(fused), composed_nodes = nodes(composed);
  std::printf("graph nodes of one layer's step: fused %zu, composed %zu\n", fused_nodes, composed_nodes);
  RecordProperty("fused_nodes", static_cast<int>(fused_nodes));
  RecordProperty("composed_nodes", static_cast<int>(composed_nodes));
  EXPECT_LT(2 * fused_nodes, composed_nodes);
}

}  // namespace
}  // namespace trainer
