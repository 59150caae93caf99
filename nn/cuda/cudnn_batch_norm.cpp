#include "nn/cuda/cudnn_batch_norm.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "nn/cuda/cuda_backend.h"
#include "nn/cuda/cuda_common.h"
#include "nn/cuda/cudnn_bn_descriptors.h"

namespace trainer {
namespace cuda {
namespace {

std::atomic<int64_t> g_calls{0};

constexpr cudnnBatchNormMode_t kMode = kBnMode;

// What one input shape needs from cuDNN, made at its first call and kept: the descriptors, the
// workspace size, or that cuDNN declined the shape (then the caller's kernels run it from then on).
struct ShapePlan {
  BnDescriptors d;
  size_t workspace = 0;
  std::atomic<bool> supported{false};  // false from the first failed call on
};

using PlanKey = std::tuple<int64_t, int64_t, int64_t, int64_t, DType, bool>;  // N, C, H, W, dtype, relu

cudnnBatchNormOps_t ops_for(bool relu) {
  return relu ? CUDNN_BATCHNORM_OPS_BN_ACTIVATION : CUDNN_BATCHNORM_OPS_BN;
}

void decline(const Tensor& x, const std::string& why) {
  std::fprintf(stderr, "trainer: cuDNN batch norm declines %s %s: %s; our kernels run it\n",
               std::string(dtype_name(x.dtype())).c_str(), shape_str(x.shape()).c_str(), why.c_str());
}

// The shape's descriptors and workspace size, or supported = false when cuDNN declines the shape. It
// must also want no reserve space: that would hold what cuDNN's own forward writes, and ours does not.
void build(ShapePlan& p, const Tensor& x, bool relu) {
  const cudnnHandle_t h = cuda_context().cudnn;
  cudnnStatus_t st = p.d.create(x);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnGetBatchNormalizationBackwardExWorkspaceSize(h, kMode, ops_for(relu), p.d.x,
                                                           relu ? p.d.x : nullptr, p.d.x, nullptr, p.d.x,
                                                           p.d.bn, relu ? p.d.relu : nullptr, &p.workspace);
  size_t reserve = 0;
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnGetBatchNormalizationTrainingExReserveSpaceSize(h, kMode, ops_for(relu),
                                                              relu ? p.d.relu : nullptr, p.d.x, &reserve);
  if (st != CUDNN_STATUS_SUCCESS) return decline(x, cudnnGetErrorString(st));
  if (reserve != 0)
    return decline(x, "it wants " + std::to_string(reserve) + " bytes of reserve space from its own forward");
  p.supported = true;
}

ShapePlan& plan_for(const Tensor& x, bool relu) {
  static std::mutex mutex;
  static auto* plans = new std::map<PlanKey, std::unique_ptr<ShapePlan>>();  // leaked: kept to exit
  const PlanKey key{x.size(0), x.size(1), x.size(2), x.size(3), x.dtype(), relu};
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<ShapePlan>& p = (*plans)[key];
  if (!p) {
    p = std::make_unique<ShapePlan>();
    build(*p, x, relu);
  }
  return *p;
}

}  // namespace

bool cudnn_batch_norm_enabled() { return cuda_options().cudnn_batch_norm; }
int64_t cudnn_batch_norm_calls() { return g_calls; }

}  // namespace cuda

std::optional<BnGrads> CudaBackend::bn_backward_fused(const Tensor& grad_y, const Tensor& x,
                                                      const Tensor& mean, const Tensor& invstd,
                                                      const Tensor& gamma, const Tensor& beta,
                                                      const Tensor& relu_out, double eps) {
  using namespace cuda;
  if (!cudnn_batch_norm_enabled() || cuda_deterministic()) return std::nullopt;
  const MemoryFormat cl = MemoryFormat::channels_last;
  if (x.dim() != 4 || (x.dtype() != DType::bf16 && x.dtype() != DType::f16) || !x.is_contiguous(cl) ||
      x.device() != current_device() || grad_y.shape() != x.shape() || grad_y.dtype() != x.dtype())
    return std::nullopt;
  const int64_t C = x.size(1);
  if (!bn_channel_f32(mean, C) || !bn_channel_f32(invstd, C) || !bn_channel_f32(gamma, C) ||
      !bn_channel_f32(beta, C))
    return std::nullopt;
  const bool relu = relu_out.defined();
  if (relu && (relu_out.shape() != x.shape() || relu_out.dtype() != x.dtype() || !relu_out.is_contiguous(cl)))
    return std::nullopt;
  // PyTorch's limits for cuDNN's batch norm in training (its "cudnn bn size fix"): int32 element
  // counts and N at most 880801.
  if (x.numel() >= std::numeric_limits<int32_t>::max() || x.size(0) > 880801) return std::nullopt;
  ShapePlan& p = plan_for(x, relu);
  if (!p.supported) return std::nullopt;
  const Tensor dy = grad_y.contiguous(cl);
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device(), cl);
  Tensor dgamma = Tensor::empty({C}, DType::f32, x.device()),
         dbeta = Tensor::empty({C}, DType::f32, x.device());
  const Tensor workspace =
      Tensor::empty({static_cast<int64_t>(std::max<size_t>(p.workspace, 16))}, DType::u8, x.device());
  const float one = 1.0f, zero = 0.0f;
  // The saved statistics are ours (mean, 1 / sqrt(var + eps)), which is what cuDNN's forward saves.
  const cudnnStatus_t st = cudnnBatchNormalizationBackwardEx(
      cuda_context().cudnn, kMode, ops_for(relu), &one, &zero, &one, &zero, p.d.x, x.raw_data(),
      relu ? p.d.x : nullptr, relu ? relu_out.raw_data() : nullptr, p.d.x, dy.raw_data(), nullptr, nullptr,
      p.d.x, dx.raw_data(), p.d.bn, gamma.raw_data(), beta.raw_data(), dgamma.raw_data(), dbeta.raw_data(),
      std::max(eps, CUDNN_BN_MIN_EPSILON), mean.raw_data(), invstd.raw_data(), relu ? p.d.relu : nullptr,
      workspace.raw_data(), static_cast<size_t>(workspace.numel()), nullptr, 0);
  if (st != CUDNN_STATUS_SUCCESS) {
    // Nothing has used dx or the sums yet: our kernels can still run this call, unless a capture is
    // recording it (a failed capture ends the step anyway, with this error).
    if (cuda_stream_capturing()) cudnn_check(st, "cudnnBatchNormalizationBackwardEx", __FILE__, __LINE__);
    p.supported = false;
    decline(x, std::string(cudnnGetErrorString(st)) + " at its first call");
    return std::nullopt;
  }
  ++g_calls;
  return BnGrads{dx, dgamma, dbeta};
}

}  // namespace trainer
