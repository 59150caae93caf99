#include "app/train/step_graph.h"

#include <stdexcept>

#include "dist/comm.h"
#include "nn/runtime.h"

namespace trainer {

struct StepGraph::Graph {
  runtime::Graph graph;
};

StepGraph::StepGraph(Comm* comm) : comm_(comm), graph_(std::make_unique<Graph>()) {}
StepGraph::~StepGraph() = default;

bool StepGraph::accepts(const Tensor& images, const Tensor& labels) const {
  if (images_.defined())  // captured (or capturing): the graph's own shapes and layout
    return images.shape() == images_.shape() && labels.shape() == labels_.shape() &&
           images.dtype() == images_.dtype() && labels.dtype() == labels_.dtype();
  return images.shape() == eager_images_shape_ && labels.shape() == eager_labels_shape_;
}

void StepGraph::note_eager_step(const Tensor& images, const Tensor& labels) {
  if (images_.defined()) return;
  eager_images_shape_ = images.shape();
  eager_labels_shape_ = labels.shape();
}

void StepGraph::load(const Tensor& images, const Tensor& labels) {
  if (!images_.defined()) {
    images_ = Tensor::empty(images.shape(), images.dtype(), images.device(), images.suggest_memory_format());
    labels_ = Tensor::empty(labels.shape(), labels.dtype(), labels.device());
  }
  images_.copy_(images);
  labels_.copy_(labels);
}

bool StepGraph::captured() const { return graph_->graph.captured(); }
size_t StepGraph::nodes() const { return graph_->graph.nodes(); }

void StepGraph::capture_and_run(const std::function<Tensor()>& step) {
  if (!runtime::cuda_built()) throw std::runtime_error("CUDA graphs need a CUDA build of the trainer");
  if (!images_.defined()) throw std::logic_error("StepGraph::capture_and_run before load()");
  Tensor loss;
  graph_->graph.capture([&] { loss = step(); });
  loss_ = loss;
  replay();
}

void StepGraph::replay() {
  graph_->graph.replay();
  watch_replay();
}

void StepGraph::watch_replay() {
  if (comm_ && comm_->world_size() > 1) comm_->watch_graph_replay("the training step's CUDA graph");
}

}  // namespace trainer
