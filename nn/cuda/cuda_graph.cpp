#include "nn/cuda/cuda_graph.h"

#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <thread>

#include "nn/cuda/caching_allocator.h"
#include "nn/cuda/cuda_backend.h"

namespace trainer::cuda {

CudaGraph::~CudaGraph() { reset(); }

void CudaGraph::reset() {
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
  exec_ = graph_ = nullptr;
  if (pool_) {
    // Replays may still be queued: their memory must not be handed out before they finish. A replay
    // whose NCCL kernels wait for a dead peer finishes only once the communicator is aborted; if it
    // does not within a bound, the pool stays reserved (leaked) rather than this wait becoming a hang.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    cudaError_t state = cudaStreamQuery(cuda_stream());
    while (state == cudaErrorNotReady && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      state = cudaStreamQuery(cuda_stream());
    }
    if (state == cudaSuccess) {
      release_private_pool(pool_);
    } else {
      cudaGetLastError();
      std::fprintf(stderr,
                   "trainer: warning: a CUDA graph's replays did not finish within 30 s (%s); its memory "
                   "stays reserved\n",
                   cudaGetErrorName(state));
    }
  }
  pool_ = 0;
  nodes_ = 0;
}

void CudaGraph::capture(const std::function<void()>& f) {
  reset();
  cudaStream_t stream = cuda_stream();
  pool_ = create_private_pool();
  cudaGraph_t graph = nullptr;
  {
    PrivatePoolScope scope(pool_);
    // Relaxed: the allocator may call cudaMalloc for a new segment while capturing.
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    try {
      f();
    } catch (...) {
      cudaStreamEndCapture(stream, &graph);
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();
      reset();
      throw;
    }
    const cudaError_t end = cudaStreamEndCapture(stream, &graph);
    if (end != cudaSuccess || !graph) {
      cudaGetLastError();
      reset();
      throw std::runtime_error(std::string("CUDA graph capture failed: ") + cudaGetErrorString(end) +
                               " (the step waited for the device or used another stream)");
    }
  }
  graph_ = graph;
  CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes_));
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  exec_ = exec;
}

void CudaGraph::replay() {
  if (!exec_) throw std::logic_error("CudaGraph::replay before a successful capture");
  CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), cuda_stream()));
}

}  // namespace trainer::cuda
