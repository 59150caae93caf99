#pragma once
// Picks the device a run trains on from train.device and LOCAL_RANK, and initialises its backend.
#include "app/config.h"
#include "nn/device.h"

namespace trainer {

// "cpu" -> the CPU; "cuda" -> GPU local_rank (an error with a hint when this build has no CUDA backend
// or there is no such GPU: never a silent fallback to GPU 0 or to the CPU); "auto" -> GPU local_rank
// when this build has the CUDA backend and a GPU is visible, else the CPU.
Device setup_device(const Config& config, int local_rank);

// Whether the precision is supported on the device (the CPU trains in fp32 only).
void check_precision(const Config& config, Device device);

}  // namespace trainer
