#include "app/run/device_setup.h"

#include <stdexcept>

#include "app/run/capture_rules.h"
#include "nn/runtime.h"

namespace trainer {

namespace {

// train.device and LOCAL_RANK -> the device, its backend initialised.
Device pick_device(const Config& config, int local_rank) {
  const DeviceChoice wanted = config.train.device;
  if (wanted == DeviceChoice::cpu) return Device::cpu();
  if (!runtime::cuda_built()) {
    if (wanted == DeviceChoice::cuda)
      throw config_error_at(
          config, "train.device",
          "'cuda' but this trainer was built without the CUDA backend. HINT: install the CUDA "
          "toolkit in /usr/local/cuda and rebuild, or set train.device = \"cpu\"");
    return Device::cpu();
  }
  const int count = runtime::device_count();
  if (wanted == DeviceChoice::automatic && count == 0) return Device::cpu();
  if (count == 0)
    throw config_error_at(
        config, "train.device",
        "'cuda' but no GPU is visible. HINT: check nvidia-smi and CUDA_VISIBLE_DEVICES, or set "
        "train.device = \"cpu\"");
  runtime::init_device(local_rank);  // throws with a hint when local_rank >= count
  return Device::cuda(local_rank);
}

// The backend's kernel choices follow the run's one precision policy.
void apply_to_backend(const PrecisionPolicy& policy, const Config& config, Device device) {
  if (!device.is_cuda()) return;
  runtime::apply_backend_options({.allow_tf32 = policy.allow_tf32,
                                  .deterministic = config.train.deterministic,
                                  .conv_stats_fusion = policy.conv_stats_fusion,
                                  .cudnn_batch_norm = policy.cudnn_batch_norm,
                                  .fused_attention = config.train.fused_attention});
}

// The half dtype the forward pass autocasts to (train.precision "bf16" or "fp16"); none for fp32/tf32.
std::optional<DType> autocast_dtype_for(const Config& config) {
  return precision_policy_for(config.train.precision).autocast;
}

}  // namespace

RunDevice setup_device(const Config& config, int local_rank) {
  RunDevice run;
  run.device = pick_device(config, local_rank);
  check_precision(config, run.device);  // train, eval, predict, plan: a config error, not a kernel's
  run.precision = precision_policy(config, run.device);
  apply_to_backend(run.precision, config, run.device);
  return run;
}

RunDevice cpu_run_device(const Config& config) {
  return {Device::cpu(), precision_policy(config, Device::cpu())};
}

std::string gpu_id(Device device) {
  if (!device.is_cuda()) return "";
  return runtime::gpu_uuid(device.index);
}

std::string gpu_pci_bus_id(Device device) {
  if (!device.is_cuda()) return "";
  try {
    return runtime::pci_bus_id(device.index);
  } catch (const std::runtime_error&) {
    return "";  // NVML then goes without this GPU's utilisation; the run does not stop for it
  }
}

void check_precision(const Config& config, Device device) {
  if (device.is_cpu() && config.train.precision != Precision::fp32)
    throw config_error_at(
        config, "train.precision",
        "'" + std::string(precision_name(config.train.precision)) +
            "' is a GPU precision; the CPU backend computes in fp32 only (it has no fast half "
            "or tf32 arithmetic). HINT: set train.precision = \"fp32\" or run on a GPU");
}

PrecisionPolicy precision_policy(const Config& config, Device device) {
  PrecisionPolicy policy = precision_policy_for(config.train.precision);
  if (policy.loss_scaling && device.is_cuda()) {
    policy.loss_scale_host_reason = loss_scaler_host_reason(config);
    policy.loss_scale_on_device = policy.loss_scale_host_reason.empty();
  }
  policy.conv_stats_fusion = cudnn_fusion_off_reason(config, device).empty();
  policy.cudnn_batch_norm = cudnn_batchnorm_off_reason(config, device).empty();
  return policy;
}

std::string cudnn_fusion_off_reason(const Config& config, Device device) {
  if (!config.train.cudnn_fusion) return "off: train.cudnn_fusion = false";
  if (!device.is_cuda() || !autocast_dtype_for(config))
    return "off: train.cudnn_fusion needs train.precision = \"bf16\" or \"fp16\" on a GPU";
  if (config.train.deterministic) return "off: train.deterministic (the fused sums' order is not fixed)";
  // SyncBatchNorm computes its statistics itself (over all ranks): sums from the convolution would go unused.
  if (config.model.sync_bn)
    return "off: model.sync_bn (SyncBatchNorm computes its statistics over all ranks)";
  if (config.model.name.rfind("resnet", 0) != 0)
    return "not used: model.name = \"" + config.model.name +
           "\" has no convolution marked as feeding a BatchNorm (the ResNets mark theirs)";
  return "";
}

std::string cudnn_fusion_state(const Config& config, Device device) {
  const std::string off = cudnn_fusion_off_reason(config, device);
  if (!off.empty()) return off;
  return "on: BatchNorm statistics in the convolutions' epilogues, for the shapes where that timed at "
         "least 3% faster at the first step (each shape compiles cuDNN's fused kernels then)";
}

std::string cudnn_batchnorm_off_reason(const Config& config, Device device) {
  if (!config.train.cudnn_batchnorm) return "off: train.cudnn_batchnorm = false";
  if (!device.is_cuda() || !autocast_dtype_for(config))
    return "not used: it serves train.precision = \"bf16\" or \"fp16\" on a GPU";
  if (config.train.deterministic)
    return "off: train.deterministic (cuDNN documents no determinism for its batch-norm kernels)";
  if (config.model.sync_bn)
    return "not used: model.sync_bn (SyncBatchNorm all-reduces between its two backward kernels)";
  return "";
}

std::string cudnn_batchnorm_state(const Config& config, Device device) {
  const std::string off = cudnn_batchnorm_off_reason(config, device);
  if (!off.empty()) return off;
  return "on: BatchNorm backward through cuDNN's NHWC batch-norm kernels";
}

}  // namespace trainer
