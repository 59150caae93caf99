#pragma once
// Picks the device a run trains on from train.device and LOCAL_RANK, and initialises its backend.
#include <optional>
#include <string>

#include "app/config/config.h"
#include "nn/device.h"
#include "nn/tensor.h"

namespace trainer {

// "cpu" -> the CPU; "cuda" -> GPU local_rank (an error with a hint when this build has no CUDA backend
// or there is no such GPU: never a silent fallback to GPU 0 or to the CPU); "auto" -> GPU local_rank
// when this build has the CUDA backend and a GPU is visible, else the CPU.
Device setup_device(const Config& config, int local_rank);

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

// The half dtype the forward pass autocasts to (train.precision "bf16" or "fp16"); none for fp32/tf32.
std::optional<DType> autocast_dtype_for(const Config& config);

// The layout input batches are given to the model in: channels-last (NHWC) for half precision, where
// cuDNN's tensor-core kernels want it and every later activation inherits it; NCHW otherwise.
MemoryFormat input_memory_format(const Config& config);

// Why train.cudnn_fusion does not apply to this run ("off: <the key that stops it>" or "not used: ..."),
// or "" when it does. setup_device() turns the fusion on exactly when this is empty.
std::string cudnn_fusion_off_reason(const Config& config, Device device);
// What train.cudnn_fusion does in this run, for the log: the reason above, or "on: ...".
std::string cudnn_fusion_state(const Config& config, Device device);

// The same two for train.cudnn_batchnorm.
std::string cudnn_batchnorm_off_reason(const Config& config, Device device);
std::string cudnn_batchnorm_state(const Config& config, Device device);

}  // namespace trainer
