#pragma once
// How the convolution's candidates (graph-API engine configurations, legacy algorithms) are timed on
// the call's own buffers, and which one is kept: the fastest, or the one with the smallest workspace
// among those within 5% of it (kWorkspaceSlack).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <vector>

#include "nn/cuda/cuda_backend.h"
#include "nn/cuda/cudnn_switches.h"

namespace trainer::cudnn_conv {

constexpr double kWorkspaceSlack = 1.05;

// A candidate's time per call and workspace; index: its place in the caller's candidate list.
struct Timed {
  float ms;
  size_t workspace;
  int index;
};
// The index of the candidate to keep: the smallest workspace among those within kWorkspaceSlack of
// the fastest; -1 when t is empty.
int choose_timed(const std::vector<Timed>& t);

// Milliseconds per call of run() on the GPU (best of a few rounds), or infinity when a call fails.
// A lone call on an idle GPU also times the host's launch (cuDNN's execute is ~10 us of host work,
// and a split-K engine launches its workspace zeroing and its kernel separately), which a graph replay
// or a busy stream does not pay. So a short call is queued back to back, enough calls to cover about
// kQueuedWindowMs, and the mean taken. TRAINER_CUDNN_TIMING=single times one call per round, as
// sessions up to 8 did.
constexpr float kQueuedWindowMs = 0.3f;
constexpr int kMaxQueued = 8;
template <class Run>
float time_calls(Run&& run) {
  const float fail = std::numeric_limits<float>::infinity();
  if (!run()) return fail;  // warm-up
  const bool single = cudnn_switches().single_call_timing;
  cudaStream_t stream = cuda_stream();
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  float best = fail;
  int calls = 1;
  for (int round = 0; round < 3; ++round) {
    CUDA_CHECK(cudaEventRecord(a, stream));
    bool good = true;
    for (int i = 0; i < calls && good; ++i) good = run();
    CUDA_CHECK(cudaEventRecord(b, stream));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = fail;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    if (!good) {
      best = fail;
      break;
    }
    best = std::min(best, ms / static_cast<float>(calls));
    // The first round (one call) says how many calls fill the window.
    if (round == 0 && !single)
      calls = std::clamp(static_cast<int>(kQueuedWindowMs / std::max(best, 1e-3f)), 1, kMaxQueued);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return best;
}

}  // namespace trainer::cudnn_conv
