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

// One backward pass: a node runs once every consumer has sent it its gradient; a leaf's hooks fire
// once every edge that reaches it has delivered (or declined to).
class BackwardWalk {
 public:
  // Pass 1: counts, for every node, how many consumers will send it a gradient, and for every leaf
  // how many edges reach it.
  void count_consumers(const std::shared_ptr<Node>& root) {
    keep_alive_.push_back(root);
    std::vector<Node*> stack{root.get()};
    pending_[root.get()] = 0;
    while (!stack.empty()) {
      Node* node = stack.back();
      stack.pop_back();
      for (const Edge& in : node->inputs) {
        if (!in.requires_grad) continue;
        if (Node* child = in.node.get()) {
          if (pending_[child]++ == 0) {
            stack.push_back(child);
            keep_alive_.push_back(in.node);
          }
        } else {
          ++leaf_pending_[in.leaf.impl()];
        }
      }
    }
  }

  // Pass 2: runs the nodes from root, newest first, and frees each as soon as it is done.
  void run(Node* root, int root_output, const Tensor& grad_output) {
    send(root, grad_output, root_output);
    ready_.push(root);
    while (!ready_.empty()) {
      Node* node = ready_.top();
      ready_.pop();
      // Held until the inputs have theirs: a leaf adopts a gradient without a copy only when no one
      // else holds its storage, and a closure may return the gradient it was given.
      const Received received = take_received(node);
      pass_on(node, input_grads_of(node, received));
      release(node);
    }
  }

  // backward() on a leaf itself: the seed is its gradient.
  void deliver_to_lone_leaf(const Variable& leaf, const Tensor& g) {
    leaf_pending_[leaf.impl()] = 1;
    deliver_to_leaf(leaf, g);
  }

 private:
  void deliver_to_leaf(const Variable& leaf_const, const Tensor& g) {
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
    if (--leaf_pending_[leaf.impl()] <= 0)
      for (auto& hook : leaf.impl()->grad_ready_hooks) hook(leaf);
  }

  // An edge to a leaf that carried no gradient still counts as arrived: the leaf's hooks fire if it
  // got its gradient over another edge.
  void skip_leaf(const Variable& leaf_const) {
    if (--leaf_pending_[leaf_const.impl()] <= 0 && leaf_const.grad().defined()) {
      Variable leaf = leaf_const;
      for (auto& hook : leaf.impl()->grad_ready_hooks) hook(leaf);
    }
  }

  // Adds g to child's gradient. With backward_of_two the second part is kept apart from the first;
  // a third part is added in arrival order, as without backward_of_two.
  void send(Node* child, const Tensor& g, int output_nr) {
    if (child->num_outputs > 1) {
      std::vector<Tensor>& slots = output_grads_[child];
      slots.resize(static_cast<size_t>(child->num_outputs));
      slots[static_cast<size_t>(output_nr)] = accumulate(slots[static_cast<size_t>(output_nr)], g);
      return;
    }
    Tensor& first = grads_[child];
    if (!child->backward_of_two || !first.defined()) {
      first = accumulate(first, g);
      return;
    }
    Tensor& second = second_parts_[child];
    if (!second.defined()) {
      second = g;
    } else {
      first = accumulate(accumulate(first, second), g);
      second = Tensor();
    }
  }

  // The gradient a node received; with backward_of_two, its second part apart; for a node with several
  // outputs, one per output.
  struct Received {
    Tensor grad, second;
    std::vector<Tensor> per_output;
  };

  Received take_received(Node* node) {
    Received r;
    if (node->num_outputs > 1) {
      if (auto it = output_grads_.find(node); it != output_grads_.end()) {
        r.per_output = std::move(it->second);
        output_grads_.erase(it);
      }
      return r;
    }
    r.grad = std::move(grads_[node]);
    grads_.erase(node);
    if (auto it = second_parts_.find(node); it != second_parts_.end()) {
      r.second = std::move(it->second);
      second_parts_.erase(it);
    }
    return r;
  }

  // Runs node's backward closure on what it received.
  std::vector<Tensor> input_grads_of(Node* node, const Received& r) {
    if (node->num_outputs > 1) return input_grads_of_multi(node, r.per_output);
    if (!node->backward)
      throw std::logic_error("autograd: backward through '" + node->name +
                             "' a second time; its saved tensors were already freed");
    // A node that received no gradient passes none on, but still releases its inputs' counts so that
    // every leaf below it is visited (and its hooks fire when it did get a gradient elsewhere).
    std::vector<Tensor> input_grads = !r.grad.defined()    ? std::vector<Tensor>(node->inputs.size())
                                      : r.second.defined() ? node->backward_of_two(r.grad, r.second)
                                                           : node->backward(r.grad);
    if (input_grads.size() != node->inputs.size())
      throw std::logic_error("autograd: '" + node->name + "' returned the wrong number of gradients");
    return input_grads;
  }

  std::vector<Tensor> input_grads_of_multi(Node* node, std::vector<Tensor> per_output) {
    if (!node->backward_multi)
      throw std::logic_error("autograd: backward through '" + node->name +
                             "' a second time; its saved tensors were already freed");
    bool any = false;
    for (const Tensor& g : per_output) any = any || g.defined();
    if (!any) return std::vector<Tensor>(node->inputs.size());
    per_output.resize(static_cast<size_t>(node->num_outputs));
    std::vector<Tensor> input_grads = node->backward_multi(per_output);
    if (input_grads.size() != node->inputs.size())
      throw std::logic_error("autograd: '" + node->name + "' returned the wrong number of gradients");
    return input_grads;
  }

  // Sends each input its gradient; a node whose consumers have all sent theirs becomes ready.
  void pass_on(Node* node, const std::vector<Tensor>& input_grads) {
    for (size_t i = 0; i < node->inputs.size(); ++i) {
      const Edge& in = node->inputs[i];
      if (!in.requires_grad) continue;
      Node* child = in.node.get();
      const Tensor& g = input_grads[i];
      if (g.defined()) {
        check_grad_shape(g, in.shape, node->name);
        if (child)
          send(child, g, in.output_nr);
        else
          deliver_to_leaf(in.leaf, g);
      } else if (!child) {
        skip_leaf(in.leaf);
      }
      if (child && --pending_[child] == 0) ready_.push(child);
    }
  }

  // Frees saved tensors and inputs as soon as a node is done, like PyTorch without retain_graph.
  static void release(Node* node) {
    node->backward = nullptr;
    node->backward_of_two = nullptr;
    node->backward_multi = nullptr;
    node->inputs.clear();
  }

  static bool newer_first(Node* a, Node* b) { return a->sequence_nr < b->sequence_nr; }

  std::unordered_map<Node*, int> pending_;
  std::unordered_map<VariableImpl*, int> leaf_pending_;
  // Nodes are owned by the variables they produced; inputs are released as nodes finish, so keep
  // every node of this graph alive until the walk is over.
  std::vector<std::shared_ptr<Node>> keep_alive_;
  std::priority_queue<Node*, std::vector<Node*>, decltype(&newer_first)> ready_{&newer_first};
  std::unordered_map<Node*, Tensor> grads_;
  // For nodes with backward_of_two: the second part of their gradient, not yet added to the first.
  std::unordered_map<Node*, Tensor> second_parts_;
  // For nodes with several outputs: the gradient of each output so far.
  std::unordered_map<Node*, std::vector<Tensor>> output_grads_;
};

}  // namespace

bool grad_mode_enabled() { return t_grad_mode; }
NoGradGuard::NoGradGuard() : previous_(t_grad_mode) { t_grad_mode = false; }
NoGradGuard::~NoGradGuard() { t_grad_mode = previous_; }

Variable::Variable(Tensor data, bool requires_grad) : impl_(std::make_shared<VariableImpl>()) {
  impl_->data = std::move(data);
  impl_->requires_grad = requires_grad;
}

Variable make_variable(Tensor data, std::shared_ptr<Node> node, int output_nr) {
  Variable v(std::move(data), node != nullptr);
  v.impl_->grad_fn = std::move(node);
  v.impl_->output_nr = output_nr;
  return v;
}

namespace {

bool any_requires_grad(const std::vector<Variable>& inputs) {
  bool needs_grad = false;
  if (t_grad_mode)
    for (const Variable& in : inputs) needs_grad = needs_grad || in.requires_grad();
  return needs_grad;
}

// A new node with an edge per input (the backward is the caller's to set).
std::shared_ptr<Node> node_over(const char* name, std::vector<Variable> inputs) {
  auto node = std::make_shared<Node>();
  node->name = name;
  node->sequence_nr = g_next_sequence_nr++;
  node->inputs.reserve(inputs.size());
  for (Variable& in : inputs) {
    Edge edge;
    edge.requires_grad = in.requires_grad();
    edge.shape = in.shape();
    if (in.grad_fn()) {
      edge.node = in.grad_fn();
      edge.output_nr = in.impl()->output_nr;
    } else if (edge.requires_grad) {
      edge.leaf = std::move(in);
    }
    node->inputs.push_back(std::move(edge));
  }
  return node;
}

}  // namespace

Variable record_op(const char* name, Tensor result, std::vector<Variable> inputs, BackwardFn backward) {
  if (!any_requires_grad(inputs)) return Variable(std::move(result), false);
  std::shared_ptr<Node> node = node_over(name, std::move(inputs));
  node->backward = std::move(backward);
  return make_variable(std::move(result), std::move(node), 0);
}

std::vector<Variable> record_op_multi(const char* name, std::vector<Tensor> results,
                                      std::vector<Variable> inputs, MultiBackwardFn backward) {
  std::vector<Variable> outputs;
  outputs.reserve(results.size());
  if (!any_requires_grad(inputs)) {
    for (Tensor& r : results) outputs.emplace_back(std::move(r), false);
    return outputs;
  }
  if (results.size() < 2)
    throw std::logic_error(std::string("record_op_multi: '") + name + "' has one output");
  std::shared_ptr<Node> node = node_over(name, std::move(inputs));
  node->num_outputs = static_cast<int>(results.size());
  node->backward_multi = std::move(backward);
  for (size_t i = 0; i < results.size(); ++i)
    outputs.push_back(make_variable(std::move(results[i]), node, static_cast<int>(i)));
  return outputs;
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
  BackwardWalk walk;
  if (!impl_->grad_fn) {
    walk.deliver_to_lone_leaf(*this, grad_output);
    return;
  }
  walk.count_consumers(impl_->grad_fn);
  walk.run(impl_->grad_fn.get(), impl_->output_nr, grad_output);
}

}  // namespace trainer
