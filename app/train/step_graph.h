#pragma once
// train.cuda_graph: the training step recorded once as a CUDA graph and replayed for every batch of
// the same shape. On a GPU a small model's step (resnet18-cifar at batch 128) is a few milliseconds of
// kernels but hundreds of launches, so the host's launches can take longer than the kernels; replaying
// them as one graph removes the host's launch cost from every step (figures: bench/PERF_NOTES.md,
// "Figures moved out of headers (session 14)").
//
// What makes a replay equal an eager step: the batch is copied into input tensors the graph reads
// (the same addresses every replay); the learning rate and AdamW's step-dependent factors are read
// from the device (Optimizer::use_device_scalars); BatchNorm counts its batches on the device; the
// weight average (ema.enabled) reads its decay's count, the skip flag and its every-N gate there. What
// stays eager: the first full-size step (it allocates the optimizer state and picks the
// convolution algorithms, which a capture must not do), and any batch of another shape (an epoch's
// smaller last batch). fp16's loss scaler decides on the device where it can (see
// loss_scaler_host_reason), and is captured with the step. Runs whose step needs the host in the
// middle (a host-side loss scaler, accumulation, dropout, ZeRO) are not captured at all (clipping is
// captured: its norm and coefficient stay on the device, clip_grad_norm_on_device):
// step_graph_blocker() says why, and the log says so.
//
// Several ranks (dist.cuda_graph): the gradient all-reduce is captured with the step. The reducer's
// hooks run during the capture, so its bucket copies (compute stream) and NCCL calls (the
// communication stream's branch of the graph) become graph nodes, joined back before the optimizer;
// SyncBatchNorm's and the device loss scaler's all-reduces likewise. Every rank captures at the same step
// (the batch shapes agree across ranks), so all issue the same collectives in the same order. NCCL
// collectives in a graph cannot be watched one by one: after each replay the communicator watches the replay
// as one unit (Comm::watch_graph_replay), with the collectives' timeout and abort.
#include <functional>
#include <memory>
#include <string>

#include "app/run/capture_rules.h"
#include "nn/tensor.h"

namespace trainer {

class Comm;

class StepGraph {
 public:
  // `comm`: the communicator whose collectives the step issues (watched after each replay); null when
  // the step communicates nothing. It must outlive the graph.
  explicit StepGraph(Comm* comm = nullptr);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Whether a batch of these inputs can run through the graph: after one eager step of the same shape
  // (the warm-up), or when it is the captured shape. note_eager_step() records the warm-up.
  bool accepts(const Tensor& images, const Tensor& labels) const;
  void note_eager_step(const Tensor& images, const Tensor& labels);

  bool captured() const;
  // Copies the batch into the graph's input tensors (device to device, queued on the compute stream).
  // The first call allocates them, in the batch's layout.
  void load(const Tensor& images, const Tensor& labels);
  const Tensor& images() const { return images_; }
  const Tensor& labels() const { return labels_; }

  // Records `step` (which reads images() and labels() and returns the loss tensor) without running it,
  // then replays it once: the step's work happens exactly once. Throws std::runtime_error naming the
  // CUDA error when the step did something a capture forbids.
  void capture_and_run(const std::function<Tensor()>& step);
  void replay();
  // The loss the last replay wrote (a device scalar).
  const Tensor& loss() const { return loss_; }
  size_t nodes() const;

 private:
  struct Graph;  // the device graph (nn/runtime.h)
  void watch_replay();
  Comm* comm_;
  std::unique_ptr<Graph> graph_;  // destroyed last: the tensors below live in its memory pool
  Tensor images_, labels_;
  Tensor loss_;
  Shape eager_images_shape_, eager_labels_shape_;  // of the warm-up step; empty before it
};

}  // namespace trainer
