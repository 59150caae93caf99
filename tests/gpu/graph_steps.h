#pragma once
// The loop the CUDA-graph tests share: a training step run on a new batch each time, eagerly until
// `capture_at`, then captured once as a CUDA graph and replayed, with each step's loss recorded.
#include <functional>
#include <optional>
#include <vector>

#include "nn/amp/autocast.h"
#include "nn/cuda/cuda_graph.h"
#include "nn/functional.h"
#include "nn/modules/module.h"
#include "nn/random.h"
#include "nn/tensor.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainer::gpu_test {

struct GraphSteps {
  int steps = 0;
  int capture_at = -1;                  // the step captured (and replayed from then on); -1: all eager
  std::function<void(int)> load_batch;  // writes batch i into the step's input tensors
  std::function<void()> step;           // one training step on those tensors
  std::function<double()> loss;         // the loss the last step computed
  std::function<void()> after_replay;   // optional: after each replay (e.g. watch it)
};

// The step's input tensors for CIFAR-shaped batches of n on the GPU: random images x (channels-last
// for half precision, as the trainer gives them) and labels y (zeros until filled).
struct CifarBatch {
  Tensor x, y;
};
inline CifarBatch cifar_batch(Generator& gen, int64_t n, std::optional<DType> half) {
  return {on_gpu(random({n, 3, 32, 32}, gen), half ? MemoryFormat::channels_last : MemoryFormat::contiguous),
          Tensor::zeros({n}, DType::i64, gpu())};
}

// The cross-entropy of model(x) against labels y, the forward autocast to `half` (none: fp32).
inline Variable autocast_loss(Module& model, const Tensor& x, const Tensor& y, std::optional<DType> half) {
  AutocastScope autocast(half);
  return F::cross_entropy(model(Variable(x)), y);
}

// Fills the i64 label tensor y with classes in [0, classes) drawn from gen.
inline void random_labels(Tensor& y, Generator& gen, int classes = 10) {
  std::vector<int64_t> t(static_cast<size_t>(y.numel()));
  for (int64_t& v : t) v = static_cast<int64_t>(gen.below(classes));
  y.copy_(Tensor::from_vector(t, y.shape()));
}

inline std::vector<double> run_graph_steps(const GraphSteps& s) {
  cuda::CudaGraph graph;
  std::vector<double> losses;
  for (int i = 0; i < s.steps; ++i) {
    s.load_batch(i);
    if (i == s.capture_at) graph.capture(s.step);
    if (graph.captured()) {
      graph.replay();
      if (s.after_replay) s.after_replay();
    } else {
      s.step();
    }
    losses.push_back(s.loss());
  }
  return losses;
}

}  // namespace trainer::gpu_test
