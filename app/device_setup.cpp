#include "app/device_setup.h"

#ifdef TRAINER_WITH_CUDA
#include "nn/cuda/cuda_backend.h"
#endif

namespace trainer {

Device setup_device(const Config& config, int local_rank) {
  const std::string& wanted = config.train.device;
  if (wanted == "cpu") return Device::cpu();
#ifdef TRAINER_WITH_CUDA
  const int count = cuda_device_count();
  if (wanted == "auto" && count == 0) return Device::cpu();
  if (count == 0)
    throw config_error_at(
        config, "train.device",
        "'cuda' but no GPU is visible. HINT: check nvidia-smi and CUDA_VISIBLE_DEVICES, or set "
        "train.device = \"cpu\"");
  init_cuda_backend(local_rank);  // throws with a hint when local_rank >= count
  cuda_set_allow_tf32(config.train.precision == "tf32");
  cuda_set_deterministic(config.train.deterministic);
  return Device::cuda(local_rank);
#else
  if (wanted == "cuda")
    throw config_error_at(
        config, "train.device",
        "'cuda' but this trainer was built without the CUDA backend. HINT: install the CUDA "
        "toolkit in /usr/local/cuda and rebuild, or set train.device = \"cpu\"");
  (void)local_rank;
  return Device::cpu();
#endif
}

void check_precision(const Config& config, Device device) {
  if (device.is_cpu() && config.train.precision != "fp32")
    throw config_error_at(
        config, "train.precision",
        "'" + config.train.precision +
            "' is a GPU precision; the CPU backend trains in fp32 only (it has no fast half "
            "or tf32 arithmetic). HINT: set train.precision = \"fp32\" or train on a GPU");
}

std::optional<DType> autocast_dtype_for(const Config& config) {
  if (config.train.precision == "bf16") return DType::bf16;
  if (config.train.precision == "fp16") return DType::f16;
  return std::nullopt;
}

MemoryFormat input_memory_format(const Config& config) {
  return autocast_dtype_for(config) ? MemoryFormat::channels_last : MemoryFormat::contiguous;
}

}  // namespace trainer
