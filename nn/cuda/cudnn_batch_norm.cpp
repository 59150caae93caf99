#include "nn/cuda/cudnn_batch_norm.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "nn/cuda/cuda_backend.h"
#include "nn/cuda/cuda_common.h"

namespace trainer {
namespace cuda {
namespace {

std::atomic<bool> g_on{false};

constexpr cudnnBatchNormMode_t kMode = CUDNN_BATCHNORM_SPATIAL_PERSISTENT;

// What one input shape needs from cuDNN, made at its first call and kept: the descriptors, the
// workspace size, or that cuDNN declined the shape (then the caller's kernels run it from then on).
struct ShapePlan {
  cudnnTensorDescriptor_t x = nullptr, bn = nullptr;
  cudnnActivationDescriptor_t relu = nullptr;
  size_t workspace = 0;
  bool supported = false;
  ShapePlan() = default;
  ShapePlan(const ShapePlan&) = delete;
  ShapePlan& operator=(const ShapePlan&) = delete;
  ~ShapePlan() {
    if (relu) cudnnDestroyActivationDescriptor(relu);
    if (bn) cudnnDestroyTensorDescriptor(bn);
    if (x) cudnnDestroyTensorDescriptor(x);
  }
};

using PlanKey = std::tuple<int64_t, int64_t, int64_t, int64_t, DType, bool>;  // N, C, H, W, dtype, relu

const ShapePlan& plan_for(const Tensor& x, bool relu) {
  static std::mutex mutex;
  static auto* plans = new std::map<PlanKey, std::unique_ptr<ShapePlan>>();  // leaked: kept to exit
  const PlanKey key{x.size(0), x.size(1), x.size(2), x.size(3), x.dtype(), relu};
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<ShapePlan>& p = (*plans)[key];
  if (p) return *p;
  p = std::make_unique<ShapePlan>();
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&p->x));
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&p->bn));
  CUDNN_CHECK(cudnnCreateActivationDescriptor(&p->relu));
  const cudnnDataType_t type = x.dtype() == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->x, CUDNN_TENSOR_NHWC, type, static_cast<int>(x.size(0)),
                                         static_cast<int>(x.size(1)), static_cast<int>(x.size(2)),
                                         static_cast<int>(x.size(3))));
  CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(p->bn, p->x, kMode));
  CUDNN_CHECK(cudnnSetActivationDescriptor(p->relu, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0));
  const cudnnBatchNormOps_t ops = relu ? CUDNN_BATCHNORM_OPS_BN_ACTIVATION : CUDNN_BATCHNORM_OPS_BN;
  const cudnnStatus_t st = cudnnGetBatchNormalizationBackwardExWorkspaceSize(
      cuda_context().cudnn, kMode, ops, p->x, relu ? p->x : nullptr, p->x, nullptr, p->x, p->bn,
      relu ? p->relu : nullptr, &p->workspace);
  p->supported = st == CUDNN_STATUS_SUCCESS;
  if (!p->supported)
    std::fprintf(stderr, "trainer: cuDNN batch norm declines %s %s: %s; our kernels run it\n",
                 std::string(dtype_name(x.dtype())).c_str(), shape_str(x.shape()).c_str(),
                 cudnnGetErrorString(st));
  return *p;
}

// A dense f32 [C] tensor on the current device.
bool channel_f32(const Tensor& t, int64_t C) {
  return t.defined() && t.dtype() == DType::f32 && t.dim() == 1 && t.size(0) == C && t.is_contiguous() &&
         t.device() == current_device();
}

}  // namespace

void set_cudnn_batch_norm(bool on) { g_on = on; }
bool cudnn_batch_norm_enabled() { return g_on; }

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
  if (!channel_f32(mean, C) || !channel_f32(invstd, C) || !channel_f32(gamma, C) || !channel_f32(beta, C))
    return std::nullopt;
  const bool relu = relu_out.defined();
  if (relu && (relu_out.shape() != x.shape() || relu_out.dtype() != x.dtype() || !relu_out.is_contiguous(cl)))
    return std::nullopt;
  const ShapePlan& p = plan_for(x, relu);
  if (!p.supported) return std::nullopt;
  const Tensor dy = grad_y.contiguous(cl);
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device(), cl);
  Tensor dgamma = Tensor::empty({C}, DType::f32, x.device()),
         dbeta = Tensor::empty({C}, DType::f32, x.device());
  const Tensor workspace =
      Tensor::empty({static_cast<int64_t>(std::max<size_t>(p.workspace, 16))}, DType::u8, x.device());
  const float one = 1.0f, zero = 0.0f;
  // The saved statistics are ours (mean, 1 / sqrt(var + eps)), which is what cuDNN's forward saves.
  CUDNN_CHECK(cudnnBatchNormalizationBackwardEx(
      cuda_context().cudnn, kMode, relu ? CUDNN_BATCHNORM_OPS_BN_ACTIVATION : CUDNN_BATCHNORM_OPS_BN, &one,
      &zero, &one, &zero, p.x, x.raw_data(), relu ? p.x : nullptr, relu ? relu_out.raw_data() : nullptr, p.x,
      dy.raw_data(), nullptr, nullptr, p.x, dx.raw_data(), p.bn, gamma.raw_data(), beta.raw_data(),
      dgamma.raw_data(), dbeta.raw_data(), std::max(eps, CUDNN_BN_MIN_EPSILON), mean.raw_data(),
      invstd.raw_data(), relu ? p.relu : nullptr, workspace.raw_data(),
      static_cast<size_t>(workspace.numel()), nullptr, 0));
  return BnGrads{dx, dgamma, dbeta};
}

}  // namespace trainer
