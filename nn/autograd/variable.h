#pragma once
// Dynamic tape autograd in the style of flashlight's Variable / PyTorch: a Variable is a shared handle
// to a tensor, its gradient and the node that produced it. Each op records a Node holding its inputs
// and one gradient closure; backward() walks the nodes in reverse creation order. Leaves accumulate
// into .grad() and then fire their "gradient ready" hooks, which the data-parallel reducer uses to
// start all-reducing a bucket while the rest of backward still runs.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nn/tensor.h"

namespace trainer {

struct Node;
class Variable;

using GradReadyHook = std::function<void(Variable&)>;

struct VariableImpl {
  Tensor data;
  Tensor grad;
  bool requires_grad = false;
  std::shared_ptr<Node> grad_fn;  // null for leaves
  int output_nr = 0;              // which of grad_fn's outputs this is (record_op_multi)
  std::vector<GradReadyHook> grad_ready_hooks;
};

class Variable {
 public:
  Variable() = default;  // undefined
  explicit Variable(Tensor data, bool requires_grad = false);

  bool defined() const { return impl_ != nullptr; }
  const Tensor& data() const { return impl_->data; }
  Tensor& data() { return impl_->data; }
  // The accumulated gradient; undefined until a backward reaches this leaf.
  const Tensor& grad() const { return impl_->grad; }
  Tensor& grad() { return impl_->grad; }
  bool requires_grad() const { return impl_ && impl_->requires_grad; }
  void set_requires_grad(bool value) { impl_->requires_grad = value; }
  bool is_leaf() const { return impl_->grad_fn == nullptr; }
  const std::shared_ptr<Node>& grad_fn() const { return impl_->grad_fn; }

  const Shape& shape() const { return impl_->data.shape(); }
  int64_t size(int dim) const { return impl_->data.size(dim); }
  int dim() const { return impl_->data.dim(); }
  int64_t numel() const { return impl_->data.numel(); }
  DType dtype() const { return impl_->data.dtype(); }
  Device device() const { return impl_->data.device(); }
  double item() const { return impl_->data.item(); }

  // Backpropagates from this variable; without an argument it must hold one element (seed 1).
  void backward();
  void backward(const Tensor& grad_output);
  // Drops the gradient (PyTorch's set_to_none): the next backward stores a fresh one.
  void zero_grad() { impl_->grad = Tensor(); }
  void add_grad_ready_hook(GradReadyHook hook) { impl_->grad_ready_hooks.push_back(std::move(hook)); }
  void clear_grad_ready_hooks() { impl_->grad_ready_hooks.clear(); }
  // Same data, no history.
  Variable detach() const { return Variable(impl_->data, false); }

  VariableImpl* impl() const { return impl_.get(); }
  bool same(const Variable& other) const { return impl_ == other.impl_; }

 private:
  friend Variable make_variable(Tensor, std::shared_ptr<Node>, int);
  std::shared_ptr<VariableImpl> impl_;
};

// Receives the gradient of the node's output and returns one gradient per input (an undefined
// tensor for inputs that need none).
using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_output)>;
// The same for a gradient that arrives in two parts (the output feeds two ops): the backward of
// a + b, for a node whose first pass can add them as it reads (a residual join and the ReLU before it).
using BackwardOfTwoFn = std::function<std::vector<Tensor>(const Tensor& part_a, const Tensor& part_b)>;
// The backward of an op with several outputs (record_op_multi): one gradient per output, undefined for
// an output that received none (nothing consumed it, or its consumers sent none).
using MultiBackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs)>;

// Where an input's gradient goes. A node does not keep its inputs' data alive: only what its
// backward closure saved survives until backward (like PyTorch's edges), so an activation is freed as
// soon as nothing needs it.
struct Edge {
  std::shared_ptr<Node> node;  // producer of a non-leaf input; null for leaves and constants
  int output_nr = 0;           // which of node's outputs the input is
  Variable leaf;               // the input itself when it is a leaf that requires a gradient
  bool requires_grad = false;
  Shape shape;  // to check the gradient the op returns
};

struct Node {
  std::string name;
  uint64_t sequence_nr = 0;  // creation order; backward runs newest first
  std::vector<Edge> inputs;
  BackwardFn backward;
  // Optional: used instead of backward(a + b) when exactly two parts arrive. Its result must equal
  // backward(a + b) bit for bit.
  BackwardOfTwoFn backward_of_two;
  // Set instead of backward for a node with several outputs (num_outputs > 1).
  int num_outputs = 1;
  MultiBackwardFn backward_multi;
};

// Gives the node of `v` (the output of the op just recorded) a backward_of_two; nothing for a
// variable without a node.
void set_backward_of_two(const Variable& v, BackwardOfTwoFn backward_of_two);

// Records an op: returns `result` as a Variable whose node backpropagates through `backward` into
// `inputs`, or a plain Variable when grad mode is off or no input requires a gradient.
Variable record_op(const char* name, Tensor result, std::vector<Variable> inputs, BackwardFn backward);
// The same for an op with several outputs that one backward differentiates together (a residual add
// and the layer norm of its sum): returns one Variable per result, all with the same node. The node
// runs once every consumer of every output has sent its gradient.
std::vector<Variable> record_op_multi(const char* name, std::vector<Tensor> results,
                                      std::vector<Variable> inputs, MultiBackwardFn backward);

// Whether ops record nodes on this thread. NoGradGuard turns recording off for a scope.
bool grad_mode_enabled();
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace trainer
