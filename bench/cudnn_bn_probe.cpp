// Would cuDNN's own batch norm pay here? For each BatchNorm shape of resnet18-cifar at a batch size
// (channels-last, bf16 and f16), times cuDNN's NHWC training kernels (cudnnBatchNormalization-
// ForwardTrainingEx / BackwardEx, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, with the ReLU fused, and with
// the residual add + ReLU fused) against what a training step runs today (forward: bn_train_stats +
// bn_apply; backward: bn_backward_reduce + bn_backward_input, after the ReLU's masking pass for the
// residual tail), and compares their outputs. Those cuDNN kernels are what PyTorch's fp16 step runs
// (bench/PERF_NOTES.md, v9); PyTorch sends bf16 to its own kernels, so whether cuDNN takes bf16 at
// NHWC is the first question. Times are per call, 50 calls queued back to back, best of 3 rounds.
// Differences are max |a - b| / max |b|, so one element on the ReLU's edge shows whole: in f16 a
// pre-activation below 2^-25 rounds to an output of 0, which our mask (output > 0) blocks and cuDNN's
// (its bitmask, or its own output) may pass. With tens of millions of elements that happens to about
// one element per few shapes, and shows as dx / dz differences of 0.2-1
// (results/2026-12-02_h200_torch_reference_best.txt).
//   cudnn_bn_probe [--batch 512] [--dtype bf16|f16|both]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

#include "bench/cudnn/relative_difference.h"
#include "bench/probe_args.h"
#include "nn/backend.h"
#include "nn/cuda/conv_stats_graph.h"
#include "nn/cuda/cuda_backend.h"
#include "nn/random.h"
#include "nn/tensor.h"

namespace trainer {
namespace {

using bench::relative_difference;

constexpr double kEps = 1e-5, kMomentum = 0.1;

Tensor random_on_gpu(const Shape& shape, DType dtype, Generator& gen, double lo, double hi,
                     MemoryFormat format) {
  Tensor host = Tensor::empty(shape, DType::f32);
  uniform_(host, lo, hi, gen);
  Tensor g = Tensor::empty(shape, dtype, Device::cuda(0), format);
  g.copy_(host.to(dtype));
  return g;
}

struct CudnnDescriptors {
  cudnnTensorDescriptor_t x = nullptr, bn = nullptr;
  cudnnActivationDescriptor_t relu = nullptr;
  CudnnDescriptors(DType dtype, const Shape& s) {
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&x));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&bn));
    CUDNN_CHECK(cudnnCreateActivationDescriptor(&relu));
    const cudnnDataType_t t = dtype == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NHWC, t, static_cast<int>(s[0]),
                                           static_cast<int>(s[1]), static_cast<int>(s[2]),
                                           static_cast<int>(s[3])));
    CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(bn, x, CUDNN_BATCHNORM_SPATIAL_PERSISTENT));
    CUDNN_CHECK(cudnnSetActivationDescriptor(relu, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0));
  }
  ~CudnnDescriptors() {
    cudnnDestroyActivationDescriptor(relu);
    cudnnDestroyTensorDescriptor(bn);
    cudnnDestroyTensorDescriptor(x);
  }
  CudnnDescriptors(const CudnnDescriptors&) = delete;
  CudnnDescriptors& operator=(const CudnnDescriptors&) = delete;
};

void* ptr(const Tensor& t) { return t.defined() ? t.raw_data() : nullptr; }

// A channels-last f32 copy on the GPU (the reference's inputs).
Tensor f32_copy(const Tensor& t) {
  if (!t.defined()) return t;
  Tensor c = Tensor::empty(t.shape(), DType::f32, t.device(), MemoryFormat::channels_last);
  c.copy_(t);
  return c;
}

// Our forward and backward, as F::batch_norm runs them.
struct Ours {
  Tensor mean, invstd, y, dx, dz, sum_dy, sum_dy_xhat;
  void forward(Backend& k, const Tensor& x, const Tensor& z, const Tensor& gamma, const Tensor& beta,
               Tensor& rm, Tensor& rv) {
    std::tie(mean, invstd) = k.bn_train_stats(x, kEps, kMomentum, rm, rv);
    y = k.bn_apply(x, mean, invstd, gamma, beta, BnEpilogue{z, true});
  }
  void backward(Backend& k, const Tensor& x, const Tensor& dy, const Tensor& gamma, bool residual) {
    // The residual tail masks its gradient as a tensor (it is also the residual's gradient).
    const Tensor g = residual ? k.unary_backward(UnaryOp::relu, dy, Tensor(), y) : dy;
    const Tensor mask = residual ? Tensor() : y;
    std::tie(sum_dy, sum_dy_xhat) = k.bn_backward_reduce(g, x, mean, invstd, mask);
    dx = k.bn_backward_input(g, x, mean, invstd, gamma, sum_dy, sum_dy_xhat, x.numel() / x.size(1), mask);
    dz = residual ? g : Tensor();
  }
};

// One shape and variant: prints the four times and the outputs' differences.
void probe(DType dtype, const Shape& shape, bool residual, Generator& gen) {
  using cuda::conv_stats::time_per_call_ms;
  const MemoryFormat cl = MemoryFormat::channels_last;
  const Device dev = Device::cuda(0);
  const int64_t C = shape[1];
  Backend& k = backend_for(dev);
  const Tensor x = random_on_gpu(shape, dtype, gen, -2.0, 2.0, cl),
               dy = random_on_gpu(shape, dtype, gen, -1.0, 1.0, cl);
  const Tensor z = residual ? random_on_gpu(shape, dtype, gen, -1.0, 1.0, cl) : Tensor();
  const Tensor gamma = random_on_gpu({C}, DType::f32, gen, 0.5, 1.5, MemoryFormat::contiguous),
               beta = random_on_gpu({C}, DType::f32, gen, -0.5, 0.5, MemoryFormat::contiguous);
  Tensor rm = Tensor::zeros({C}, DType::f32, dev), rv = Tensor::ones({C}, DType::f32, dev);
  std::printf("%-5s %-16s %-9s", std::string(dtype_name(dtype)).c_str(), shape_str(shape).c_str(),
              residual ? "add+relu" : "relu");

  Ours ours;
  auto ours_forward = [&] {
    ours.forward(k, x, z, gamma, beta, rm, rv);
    return true;
  };
  auto ours_backward = [&] {
    ours.backward(k, x, dy, gamma, residual);
    return true;
  };
  ours_forward();
  ours_backward();
  const float ours_fwd = time_per_call_ms(ours_forward), ours_bwd = time_per_call_ms(ours_backward);

  // cuDNN's.
  const cudnnHandle_t h = cuda_context().cudnn;
  CUDNN_CHECK(cudnnSetStream(h, cuda_stream()));
  const CudnnDescriptors d(dtype, shape);
  const cudnnBatchNormMode_t mode = CUDNN_BATCHNORM_SPATIAL_PERSISTENT;
  const cudnnBatchNormOps_t ops =
      residual ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION : CUDNN_BATCHNORM_OPS_BN_ACTIVATION;
  size_t fwd_ws = 0, bwd_ws = 0, reserve = 0;
  cudnnStatus_t st = cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
      h, mode, ops, d.x, residual ? d.x : nullptr, d.x, d.bn, d.relu, &fwd_ws);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnGetBatchNormalizationBackwardExWorkspaceSize(
        h, mode, ops, d.x, d.x, d.x, residual ? d.x : nullptr, d.x, d.bn, d.relu, &bwd_ws);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnGetBatchNormalizationTrainingExReserveSpaceSize(h, mode, ops, d.relu, d.x, &reserve);
  if (st != CUDNN_STATUS_SUCCESS) {
    std::printf(" ours fwd %.4f bwd %.4f ms | cuDNN: %s\n", ours_fwd, ours_bwd, cudnnGetErrorString(st));
    return;
  }
  auto bytes = [&](size_t n) {
    return Tensor::empty({static_cast<int64_t>(std::max<size_t>(n, 16))}, DType::u8, dev);
  };
  const Tensor ws = bytes(std::max(fwd_ws, bwd_ws)), rs = bytes(reserve);
  const Tensor y = Tensor::empty(shape, dtype, dev, cl), dx = Tensor::empty(shape, dtype, dev, cl),
               dz = residual ? Tensor::empty(shape, dtype, dev, cl) : Tensor();
  const Tensor saved_mean = Tensor::empty({C}, DType::f32, dev),
               saved_invstd = Tensor::empty({C}, DType::f32, dev),
               dgamma = Tensor::empty({C}, DType::f32, dev), dbeta = Tensor::empty({C}, DType::f32, dev);
  Tensor crm = Tensor::zeros({C}, DType::f32, dev), crv = Tensor::ones({C}, DType::f32, dev);
  const float one = 1.0f, zero = 0.0f;
  cudnnStatus_t last = CUDNN_STATUS_SUCCESS;
  auto cudnn_forward = [&] {
    last = cudnnBatchNormalizationForwardTrainingEx(
        h, mode, ops, &one, &zero, d.x, ptr(x), residual ? d.x : nullptr, ptr(z), d.x, ptr(y), d.bn,
        ptr(gamma), ptr(beta), kMomentum, ptr(crm), ptr(crv), kEps, ptr(saved_mean), ptr(saved_invstd),
        d.relu, ptr(ws), ws.numel(), ptr(rs), rs.numel());
    return last == CUDNN_STATUS_SUCCESS;
  };
  auto cudnn_backward = [&] {
    last = cudnnBatchNormalizationBackwardEx(
        h, mode, ops, &one, &zero, &one, &zero, d.x, ptr(x), d.x, ptr(y), d.x, ptr(dy),
        residual ? d.x : nullptr, ptr(dz), d.x, ptr(dx), d.bn, ptr(gamma), ptr(beta), ptr(dgamma), ptr(dbeta),
        kEps, ptr(saved_mean), ptr(saved_invstd), d.relu, ptr(ws), ws.numel(), ptr(rs), rs.numel());
    return last == CUDNN_STATUS_SUCCESS;
  };
  const float cudnn_fwd = time_per_call_ms(cudnn_forward);
  const float cudnn_bwd = std::isfinite(cudnn_fwd) ? time_per_call_ms(cudnn_backward) : cudnn_fwd;
  std::printf(" fwd ours %.4f cuDNN %.4f ms | bwd ours %.4f cuDNN %.4f ms", ours_fwd, cudnn_fwd, ours_bwd,
              cudnn_bwd);
  if (!std::isfinite(cudnn_bwd)) {
    std::printf(" | cuDNN: %s\n", cudnnGetErrorString(last));
    return;
  }
  // The same inputs once more through both, for the differences.
  ours_forward();
  ours_backward();
  cudnn_forward();
  cudnn_backward();
  std::printf(" | cuDNN vs ours: y %.1e dx %.1e dgamma %.1e dbeta %.1e", relative_difference(y, ours.y),
              relative_difference(dx, ours.dx), relative_difference(dgamma, ours.sum_dy_xhat),
              relative_difference(dbeta, ours.sum_dy));
  if (residual) std::printf(" dz %.1e", relative_difference(dz, ours.dz));
  // Both against our kernels in f32 on the same values (which one a large difference comes from).
  Ours f32;
  Tensor rm32 = Tensor::zeros({C}, DType::f32, dev), rv32 = Tensor::ones({C}, DType::f32, dev);
  f32.forward(k, f32_copy(x), f32_copy(z), gamma, beta, rm32, rv32);
  f32.backward(k, f32_copy(x), f32_copy(dy), gamma, residual);
  std::printf(" | vs f32: ours y %.1e dx %.1e, cuDNN y %.1e dx %.1e", relative_difference(ours.y, f32.y),
              relative_difference(ours.dx, f32.dx), relative_difference(y, f32.y),
              relative_difference(dx, f32.dx));
  std::printf(" | reserve %zu B, workspace %zu B\n", reserve, std::max(fwd_ws, bwd_ws));
}

}  // namespace
}  // namespace trainer

int main(int argc, char** argv) {
  const trainer::bench::ProbeArgs args = trainer::bench::parse_probe_args(argc, argv);
  using namespace trainer;
  init_cuda_backend(0);
  Generator gen(7);
  // resnet18-cifar's BatchNorm shapes: one per stage.
  const int64_t stages[][2] = {{64, 32}, {128, 16}, {256, 8}, {512, 4}};
  for (DType dtype : {DType::bf16, DType::f16}) {
    if (!args.wants(std::string(dtype_name(dtype)))) continue;
    for (const auto& s : stages)
      for (bool residual : {false, true}) {
        try {
          probe(dtype, {args.batch, s[0], s[1], s[1]}, residual, gen);
        } catch (const std::exception& e) {
          std::printf(" error: %s\n", e.what());
        }
        std::fflush(stdout);
      }
  }
  return 0;
}
