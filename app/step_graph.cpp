#include "app/step_graph.h"

#include <stdexcept>

#include "app/format.h"
#include "dist/comm.h"
#ifdef TRAINER_WITH_CUDA
#include "nn/cuda/cuda_graph.h"
#endif

namespace trainer {

std::string step_graph_blocker(const Config& config, int world_size) {
  if (!config.train.cuda_graph) return "train.cuda_graph = false";
  if (world_size > 1 && !config.dist.cuda_graph)
    return fmt(
        "%d ranks and dist.cuda_graph = false: set it to capture the all-reduce too, at the cost of "
        "per-phase step times",
        world_size);
  if (world_size > 1 && config.dist.backend == "tcp")
    return "dist.backend = \"tcp\": collectives through the host cannot be captured";
  if (config.train.precision == Precision::fp16 && !loss_scaler_host_reason(config).empty())
    return "train.precision = \"fp16\" with " + loss_scaler_host_reason(config) +
           ": the loss scaler decides on the host whether a step is skipped";
  if (config.train.grad_accum_steps > 1) return "train.grad_accum_steps > 1: micro-batches are not captured";
  if (config.optim.clip_grad_norm > 0) return "optim.clip_grad_norm: the gradient norm is read on the host";
  if (config.model.dropout > 0) return "model.dropout: its random masks are drawn with a host-side generator";
  if (config.dist.zero_stage > 0) return "dist.zero_stage: the sharded optimizer is not captured";
  return "";
}

std::string loss_scaler_host_reason(const Config& config) {
  if (config.optim.clip_grad_norm > 0) return "optim.clip_grad_norm";
  if (config.dist.zero_stage > 0) return "dist.zero_stage";
  return "";
}

#ifdef TRAINER_WITH_CUDA
struct StepGraph::Graph {
  cuda::CudaGraph graph;
};
#else
struct StepGraph::Graph {};
#endif

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

#ifdef TRAINER_WITH_CUDA
bool StepGraph::captured() const { return graph_->graph.captured(); }
size_t StepGraph::nodes() const { return graph_->graph.nodes(); }

void StepGraph::capture_and_run(const std::function<Tensor()>& step) {
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

#else
bool StepGraph::captured() const { return false; }
size_t StepGraph::nodes() const { return 0; }
void StepGraph::capture_and_run(const std::function<Tensor()>&) {
  throw std::runtime_error("CUDA graphs need a CUDA build of the trainer");
}
void StepGraph::replay() { throw std::logic_error("StepGraph::replay without a CUDA build"); }
#endif

void StepGraph::watch_replay() {
  if (comm_ && comm_->world_size() > 1) comm_->watch_graph_replay("the training step's CUDA graph");
}

}  // namespace trainer
