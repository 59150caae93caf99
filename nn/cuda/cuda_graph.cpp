#include "nn/cuda/cuda_graph.h"

#include <cuda_runtime.h>

#include <stdexcept>

#include "nn/cuda/caching_allocator.h"
#include "nn/cuda/cuda_backend.h"

namespace trainer::cuda {

CudaGraph::~CudaGraph() { reset(); }

void CudaGraph::reset() {
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
  exec_ = graph_ = nullptr;
  if (pool_) {
    // Replays may still be queued: their memory must not be handed out before they finish.
    cudaStreamSynchronize(cuda_stream());
    release_private_pool(pool_);
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
