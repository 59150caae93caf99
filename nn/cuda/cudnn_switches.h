#pragma once
// The environment switches of the cuDNN code, read once. They are for diagnosis, not for tuning: each
// turns off or widens a choice the trainer otherwise makes for itself, to tell whether that choice is
// the cause of a slowdown or a failure. Documented at the end of configs/reference.toml.

namespace trainer {

struct CudnnSwitches {
  // TRAINER_CUDNN_API=legacy|graph: build convolution plans with one cuDNN API only (default: both,
  // timed against each other).
  enum class Api { both, legacy, graph };
  Api api = Api::both;
  // TRAINER_CUDNN_RTC=1: also time graph-API engines that compile their kernels at run time (seconds
  // per shape at start-up).
  bool runtime_compiled_engines = false;
  // TRAINER_CUDNN_DEBUG=1: print every failed graph-API call, every timed candidate and every choice.
  bool debug = false;
  // TRAINER_CUDNN_TIMING=single: time one call per round, as sessions up to 8 did, instead of calls
  // queued back to back (nn/cuda/conv.cpp).
  bool single_call_timing = false;
};

// The switches of this process, read from the environment on first use: init_cuda_backend, at
// start-up.
const CudnnSwitches& cudnn_switches();

}  // namespace trainer
