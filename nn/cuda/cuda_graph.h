#pragma once
// A training step recorded once as a CUDA graph and replayed: one launch instead of hundreds, so a
// step that is short on the GPU is no longer bound by the host's kernel launches.
//
// What the captured callable may do: queue work on the compute stream and allocate device memory
// (served from a private pool, see caching_allocator.h). What it may not: wait for the device
// (a D2H copy, .item(), a finiteness check read on the host), use another stream, or depend on
// host values that change between replays (kernel arguments are frozen at capture: a learning
// rate, a random seed, a step count). Inputs and outputs are tensors the caller keeps: fill the
// inputs before replay(), read the outputs after.
#include <functional>
#include <string>

namespace trainer::cuda {

class CudaGraph {
 public:
  CudaGraph() = default;
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Runs f with its GPU work captured (recorded, not executed). Throws std::runtime_error naming
  // the CUDA error when f does something a capture forbids; the graph is then left empty.
  void capture(const std::function<void()>& f);
  // Queues the captured work on the compute stream (returns without waiting for it).
  void replay();
  bool captured() const { return exec_ != nullptr; }
  // Kernels and copies in the graph.
  size_t nodes() const { return nodes_; }

 private:
  void reset();
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
  int pool_ = 0;
  size_t nodes_ = 0;
};

}  // namespace trainer::cuda
