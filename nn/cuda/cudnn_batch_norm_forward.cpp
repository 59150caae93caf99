// cuDNN's batch-norm forward (with train.cudnn_batchnorm, see cudnn_batch_norm.h): a training batch norm
// (statistics, running statistics, apply with the fused ReLU or residual add + ReLU) through
// cudnnBatchNormalizationForwardTrainingEx's NHWC persistent kernels: one kernel where ours are three
// (statistics, their finish, apply). It pays at small batches, where each of our launches is short: at batch
// 128 cuDNN is 10-50% faster on every resnet18-cifar shape, while at batch 512 ours is faster for the
// residual tails of the first stages (bench/cudnn_bn_probe, bench/PERF_NOTES.md v13). So each shape is timed
// against ours at its first eager call, on scratch running statistics, and the faster is kept. A shape first
// met inside a CUDA graph capture (where nothing can be timed) runs ours.
//
// The saved statistics are cuDNN's resultSaveMean / resultSaveInvVariance: the batch mean and
// 1 / sqrt(biased var + eps), what bn_train_stats returns, so either backward can follow either
// forward. cuDNN moves the running variance with the unbiased batch variance, as PyTorch does.
#include <atomic>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "nn/cuda/conv_timing.h"
#include "nn/cuda/cuda_backend.h"
#include "nn/cuda/cuda_common.h"
#include "nn/cuda/cudnn_batch_norm.h"
#include "nn/cuda/cudnn_bn_descriptors.h"

namespace trainer {
namespace cuda {
namespace {

constexpr cudnnBatchNormMode_t kMode = kBnMode;

enum class Choice { untimed, ours, cudnn };

std::atomic<int64_t> g_calls{0};

// One input shape and epilogue: descriptors, workspace and reserve sizes, and which forward won.
struct ForwardPlan {
  BnDescriptors d;
  cudnnBatchNormOps_t ops = CUDNN_BATCHNORM_OPS_BN;
  size_t workspace = 0, reserve = 0;
  bool supported = false;
  std::atomic<Choice> choice{Choice::untimed};  // read and set outside plan_for's lock
};

// N, C, H, W, dtype, relu, residual
using PlanKey = std::tuple<int64_t, int64_t, int64_t, int64_t, DType, bool, bool>;

void build(ForwardPlan& p, const Tensor& x, bool relu, bool residual) {
  const cudnnHandle_t h = cuda_context().cudnn;
  p.ops = residual ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION
                   : (relu ? CUDNN_BATCHNORM_OPS_BN_ACTIVATION : CUDNN_BATCHNORM_OPS_BN);
  cudnnStatus_t st = p.d.create(x);
  cudnnActivationDescriptor_t act = relu ? p.d.relu : nullptr;
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
        h, kMode, p.ops, p.d.x, residual ? p.d.x : nullptr, p.d.x, p.d.bn, act, &p.workspace);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnGetBatchNormalizationTrainingExReserveSpaceSize(h, kMode, p.ops, act, p.d.x, &p.reserve);
  p.supported = st == CUDNN_STATUS_SUCCESS;
}

ForwardPlan& plan_for(const Tensor& x, bool relu, bool residual) {
  static std::mutex mutex;
  static auto* plans = new std::map<PlanKey, std::unique_ptr<ForwardPlan>>();  // leaked: kept to exit
  const PlanKey key{x.size(0), x.size(1), x.size(2), x.size(3), x.dtype(), relu, residual};
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<ForwardPlan>& p = (*plans)[key];
  if (!p) {
    p = std::make_unique<ForwardPlan>();
    build(*p, x, relu, residual);
  }
  return *p;
}

}  // namespace

int64_t cudnn_batch_norm_forward_calls() { return g_calls; }

}  // namespace cuda

std::optional<BnForward> CudaBackend::bn_forward_fused(const Tensor& x, const Tensor& gamma,
                                                       const Tensor& beta, Tensor& running_mean,
                                                       Tensor& running_var, double momentum, double eps,
                                                       const BnEpilogue& epilogue) {
  using namespace cuda;
  if (!cudnn_batch_norm_enabled() ||
      !(cuda_options().cudnn_batch_norm_forward || cuda_options().force_cudnn_batch_norm_forward) ||
      cuda_deterministic())
    return std::nullopt;
  const MemoryFormat cl = MemoryFormat::channels_last;
  if (x.dim() != 4 || (x.dtype() != DType::bf16 && x.dtype() != DType::f16) || !x.is_contiguous(cl) ||
      x.device() != current_device() || eps < CUDNN_BN_MIN_EPSILON)
    return std::nullopt;
  const int64_t C = x.size(1);
  if (!bn_channel_f32(gamma, C) || !bn_channel_f32(beta, C) || !bn_channel_f32(running_mean, C) ||
      !bn_channel_f32(running_var, C))
    return std::nullopt;
  const Tensor& z = epilogue.residual;
  const bool residual = z.defined();
  // cuDNN adds the residual only before its ReLU.
  if (residual &&
      (!epilogue.relu || z.shape() != x.shape() || z.dtype() != x.dtype() || !z.is_contiguous(cl)))
    return std::nullopt;
  // PyTorch's limits for cuDNN's batch norm in training (int32 counts, N at most 880801).
  if (x.numel() >= std::numeric_limits<int32_t>::max() || x.size(0) > 880801) return std::nullopt;
  ForwardPlan& p = plan_for(x, epilogue.relu, residual);
  if (!p.supported || (p.choice == Choice::ours && !cuda_options().force_cudnn_batch_norm_forward))
    return std::nullopt;

  auto run_cudnn = [&](Tensor& y, Tensor& mean, Tensor& invstd, Tensor& rm, Tensor& rv) {
    y = Tensor::empty(x.shape(), x.dtype(), x.device(), cl);
    mean = Tensor::empty({C}, DType::f32, x.device());
    invstd = Tensor::empty({C}, DType::f32, x.device());
    const Tensor workspace =
        Tensor::empty({static_cast<int64_t>(std::max<size_t>(p.workspace, 16))}, DType::u8, x.device());
    const Tensor reserve =
        Tensor::empty({static_cast<int64_t>(std::max<size_t>(p.reserve, 16))}, DType::u8, x.device());
    const float one = 1.0f, zero = 0.0f;
    return cudnnBatchNormalizationForwardTrainingEx(
               cuda_context().cudnn, kMode, p.ops, &one, &zero, p.d.x, x.raw_data(),
               residual ? p.d.x : nullptr, residual ? z.raw_data() : nullptr, p.d.x, y.raw_data(), p.d.bn,
               gamma.raw_data(), beta.raw_data(), momentum, rm.raw_data(), rv.raw_data(), eps,
               mean.raw_data(), invstd.raw_data(), epilogue.relu ? p.d.relu : nullptr, workspace.raw_data(),
               static_cast<size_t>(workspace.numel()), reserve.raw_data(),
               static_cast<size_t>(reserve.numel())) == CUDNN_STATUS_SUCCESS;
  };

  if (p.choice == Choice::untimed && !cuda_options().force_cudnn_batch_norm_forward) {
    if (cuda_stream_capturing()) return std::nullopt;  // timed at an eager call, if one comes
    // Both forwards on scratch running statistics, so timing moves nothing the run keeps.
    Tensor rm = running_mean.clone(), rv = running_var.clone(), y, mean, invstd;
    const float cudnn_ms = cudnn_conv::time_calls([&] { return run_cudnn(y, mean, invstd, rm, rv); });
    const float ours_ms = cudnn_conv::time_calls([&] {
      auto [m, s] = bn_train_stats(x, eps, momentum, rm, rv);
      y = bn_apply(x, m, s, gamma, beta, epilogue);
      return true;
    });
    p.choice = cudnn_ms < ours_ms ? Choice::cudnn : Choice::ours;
    if (p.choice == Choice::ours) return std::nullopt;
  }
  BnForward out;
  if (!run_cudnn(out.y, out.mean, out.invstd, running_mean, running_var)) {
    // Nothing has read the outputs: ours can still run this call, unless a capture is recording it.
    if (cuda_stream_capturing())
      throw std::runtime_error("cuDNN batch norm forward failed inside a CUDA graph capture");
    p.choice = Choice::ours;
    std::fprintf(stderr, "trainer: cuDNN batch norm forward declines %s %s; our kernels run it\n",
                 std::string(dtype_name(x.dtype())).c_str(), shape_str(x.shape()).c_str());
    return std::nullopt;
  }
  ++g_calls;
  return out;
}

}  // namespace trainer
