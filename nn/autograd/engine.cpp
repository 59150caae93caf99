// The backward pass: a topological walk over the recorded nodes, newest first, so that leaf
// gradients (and their hooks) become ready in roughly the reverse order of the forward pass.
#include <atomic>
#include <queue>
#include <stdexcept>
#include <unordered_map>

#include "nn/autograd/variable.h"
#include "nn/backend.h"

namespace trainer {
namespace {

thread_local bool t_grad_mode = true;
std::atomic<uint64_t> g_next_sequence_nr{0};

// Sums b into an accumulated gradient without writing into tensors the graph may still read.
Tensor accumulate(const Tensor& acc, const Tensor& g) {
  if (!acc.defined()) return g;
  return backend_for(acc).binary(BinaryOp::add, acc, g);
}

void check_grad_shape(const Tensor& grad, const Shape& shape, const std::string& op) {
  if (grad.shape() != shape)
    throw std::logic_error("autograd: backward of '" + op + "' returned a gradient of shape " +
                           shape_str(grad.shape()) + " for an input of shape " + shape_str(shape));
}

}  // namespace

bool grad_mode_enabled() { return t_grad_mode; }
NoGradGuard::NoGradGuard() : previous_(t_grad_mode) { t_grad_mode = false; }
NoGradGuard::~NoGradGuard() { t_grad_mode = previous_; }

Variable::Variable(Tensor data, bool requires_grad) : impl_(std::make_shared<VariableImpl>()) {
  impl_->data = std::move(data);
  impl_->requires_grad = requires_grad;
}

Variable make_variable(Tensor data, std::shared_ptr<Node> node) {
  Variable v(std::move(data), node != nullptr);
  v.impl_->grad_fn = std::move(node);
  return v;
}

Variable record_op(const char* name, Tensor result, std::vector<Variable> inputs, BackwardFn backward) {
  bool needs_grad = false;
  if (t_grad_mode)
    for (const Variable& in : inputs) needs_grad = needs_grad || in.requires_grad();
  if (!needs_grad) return Variable(std::move(result), false);
  auto node = std::make_shared<Node>();
  node->name = name;
  node->sequence_nr = g_next_sequence_nr++;
  node->inputs.reserve(inputs.size());
  for (Variable& in : inputs) {
    Edge edge;
    edge.requires_grad = in.requires_grad();
    edge.shape = in.shape();
    if (in.grad_fn())
      edge.node = in.grad_fn();
    else if (edge.requires_grad)
      edge.leaf = std::move(in);
    node->inputs.push_back(std::move(edge));
  }
  node->backward = std::move(backward);
  return make_variable(std::move(result), std::move(node));
}

void set_backward_of_two(const Variable& v, BackwardOfTwoFn backward_of_two) {
  if (v.grad_fn()) v.grad_fn()->backward_of_two = std::move(backward_of_two);
}

void Variable::backward() {
  if (numel() != 1)
    throw std::invalid_argument("backward() without a gradient needs a one-element output, got shape " +
                                shape_str(shape()));
  backward(Tensor::ones(shape(), dtype(), device()));
}

void Variable::backward(const Tensor& grad_output) {
  if (!requires_grad()) throw std::logic_error("backward() on a variable that does not require grad");
  check_grad_shape(grad_output, shape(), "backward seed");
  NoGradGuard no_grad;  // the backward closures must not record new nodes

  // Pass 1: count, for every node, how many consumers will send it a gradient, and for every
  // leaf how many edges reach it (its hooks fire when the last one has arrived).
  std::unordered_map<Node*, int> pending;
  std::unordered_map<VariableImpl*, int> leaf_pending;
  // Nodes are owned by the variables they produced; inputs are released as nodes finish, so keep
  // every node of this graph alive until the walk is over.
  std::vector<std::shared_ptr<Node>> keep_alive;
  if (impl_->grad_fn) {
    keep_alive.push_back(impl_->grad_fn);
    std::vector<Node*> stack{impl_->grad_fn.get()};
    pending[impl_->grad_fn.get()] = 0;
    while (!stack.empty()) {
      Node* node = stack.back();
      stack.pop_back();
      for (const Edge& in : node->inputs) {
        if (!in.requires_grad) continue;
        if (Node* child = in.node.get()) {
          if (pending[child]++ == 0) {
            stack.push_back(child);
            keep_alive.push_back(in.node);
          }
        } else {
          ++leaf_pending[in.leaf.impl()];
        }
      }
    }
  }

  auto deliver_to_leaf = [&](const Variable& leaf_const, const Tensor& g) {
    Variable leaf = leaf_const;
    check_grad_shape(g, leaf.shape(), "leaf");
    Tensor& acc = leaf.grad();
    if (!acc.defined()) {
      // The gradient must own its memory (the closure's tensor may alias others); one nobody else
      // holds, dense and exactly its storage's size, is taken as it is instead of copied. A copy keeps
      // the gradient's layout: a channels-last weight's gradient stays channels-last (a contiguous
      // copy cost two strided copies of every 3x3 convolution's weight gradient per step, there and
      // back in the optimizer).
      const MemoryFormat format = g.suggest_memory_format();
      const bool sole_owner = g.storage() && g.storage().use_count() == 1 && g.offset() == 0 &&
                              g.is_contiguous(format) && g.storage()->nbytes() == g.nbytes();
      acc = sole_owner ? g : g.clone(format);
    } else {
      backend_for(acc).axpy(acc, g, 1.0);
    }
    if (--leaf_pending[leaf.impl()] <= 0)
      for (auto& hook : leaf.impl()->grad_ready_hooks) hook(leaf);
  };

  if (!impl_->grad_fn) {  // backward on a leaf itself
    leaf_pending[impl_.get()] = 1;
    deliver_to_leaf(*this, grad_output);
    return;
  }

  auto newer_first = [](Node* a, Node* b) { return a->sequence_nr < b->sequence_nr; };
  std::priority_queue<Node*, std::vector<Node*>, decltype(newer_first)> ready(newer_first);
  std::unordered_map<Node*, Tensor> grads;
  // For nodes with backward_of_two: the second part of their gradient, not yet added to the first.
  // A third part is added in arrival order, as without backward_of_two.
  std::unordered_map<Node*, Tensor> second_parts;
  auto send = [&](Node* child, const Tensor& g) {
    Tensor& first = grads[child];
    if (!child->backward_of_two || !first.defined()) {
      first = accumulate(first, g);
      return;
    }
    Tensor& second = second_parts[child];
    if (!second.defined()) {
      second = g;
    } else {
      first = accumulate(accumulate(first, second), g);
      second = Tensor();
    }
  };
  grads[impl_->grad_fn.get()] = grad_output;
  ready.push(impl_->grad_fn.get());

  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    Tensor grad = std::move(grads[node]);
    grads.erase(node);
    Tensor second;
    if (auto it = second_parts.find(node); it != second_parts.end()) {
      second = std::move(it->second);
      second_parts.erase(it);
    }
    if (!node->backward)
      throw std::logic_error("autograd: backward through '" + node->name +
                             "' a second time; its saved tensors were already freed");
    // A node that received no gradient passes none on, but still releases its inputs' counts so that
    // every leaf below it is visited (and its hooks fire when it did get a gradient elsewhere).
    std::vector<Tensor> input_grads = !grad.defined()    ? std::vector<Tensor>(node->inputs.size())
                                      : second.defined() ? node->backward_of_two(grad, second)
                                                         : node->backward(grad);
    if (input_grads.size() != node->inputs.size())
      throw std::logic_error("autograd: '" + node->name + "' returned the wrong number of gradients");
    for (size_t i = 0; i < node->inputs.size(); ++i) {
      const Edge& in = node->inputs[i];
      if (!in.requires_grad) continue;
      Node* child = in.node.get();
      const Tensor& g = input_grads[i];
      if (g.defined()) {
        check_grad_shape(g, in.shape, node->name);
        if (child)
          send(child, g);
        else
          deliver_to_leaf(in.leaf, g);
      } else if (!child) {
        if (--leaf_pending[in.leaf.impl()] <= 0 && in.leaf.grad().defined()) {
          Variable leaf = in.leaf;
          for (auto& hook : leaf.impl()->grad_ready_hooks) hook(leaf);
        }
      }
      if (child && --pending[child] == 0) ready.push(child);
    }
    // Free saved tensors and inputs as soon as this node is done, like PyTorch without retain_graph.
    node->backward = nullptr;
    node->backward_of_two = nullptr;
    node->inputs.clear();
  }
}

}  // namespace trainer
