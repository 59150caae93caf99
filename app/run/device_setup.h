#pragma once
// Picks the device a run trains on from train.device and LOCAL_RANK, and initialises its backend.
#include <optional>
#include <string>

#include "app/config/config.h"
#include "nn/amp/precision_policy.h"
#include "nn/device.h"
#include "nn/tensor.h"

namespace trainer {

// The device a run works on and the precision decisions made for it, once (nn/amp/precision_policy.h):
// every later part takes them from here instead of deriving them from the config again.
struct RunDevice {
  Device device;
  PrecisionPolicy precision;
};

// "cpu" -> the CPU; "cuda" -> GPU local_rank (an error with a hint when this build has no CUDA backend
// or there is no such GPU: never a silent fallback to GPU 0 or to the CPU); "auto" -> GPU local_rank
// when this build has the CUDA backend and a GPU is visible, else the CPU. On a GPU the backend's
// kernel switches (TF32, determinism, cuDNN's fused paths) are set from the policy. Throws
// check_precision's config error when the device cannot run train.precision.
RunDevice setup_device(const Config& config, int local_rank);
// The CPU and its policy, for tools and tests that run on the CPU whatever train.device says.
RunDevice cpu_run_device(const Config& config);

// What names this GPU across hosts and processes ("GPU-" + its UUID, as nvidia-smi -L shows it), or ""
// for the CPU: ranks compare it so that no two train on one GPU (DistOptions::gpu_id).
std::string gpu_id(Device device);

// This GPU's PCI bus id ("0000:1b:00.0"), for NVML (metrics/gpu_utilization.h); "" for the CPU.
std::string gpu_pci_bus_id(Device device);

// Whether the precision is supported on the device (the CPU trains in fp32 only).
void check_precision(const Config& config, Device device);

// The run's precision decisions (nn/amp/precision_policy.h), made once from the config for the device:
// the precision's own (autocast, TF32, loss scaling, input layout), where fp16's loss scaler decides
// (loss_scaler_host_reason), and whether cuDNN's fused paths apply (the off reasons below).
PrecisionPolicy precision_policy(const Config& config, Device device);

// Why train.cudnn_fusion does not apply to this run ("off: <the key that stops it>" or "not used: ..."),
// or "" when it does. setup_device() turns the fusion on exactly when this is empty.
std::string cudnn_fusion_off_reason(const Config& config, Device device);
// What train.cudnn_fusion does in this run, for the log: the reason above, or "on: ...".
std::string cudnn_fusion_state(const Config& config, Device device);

// The same two for train.cudnn_batchnorm.
std::string cudnn_batchnorm_off_reason(const Config& config, Device device);
std::string cudnn_batchnorm_state(const Config& config, Device device);

}  // namespace trainer
