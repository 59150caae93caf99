// Cross-entropy with label smoothing and its backward, top-k and argmax, the dropout mask, and the
// optimizers' in-place updates (SGD with momentum / Nesterov / weight decay, one and many tensors,
// AdamW, the applied-update counters).
#include <cmath>
#include <sstream>

#include "op_case.h"

namespace trainer::op_cases {
namespace {

constexpr int64_t kN = 6, kK = 9;

OpCase cross_entropy_case(double smoothing) {
  OpCase c;
  c.name = "cross_entropy and cross_entropy_backward, label smoothing " + std::to_string(smoothing);
  c.inputs = {uniform({kN, kK}, -4.0, 4.0), labels(kN, kK), uniform({kN})};  // logits, targets, weights
  c.run = [smoothing](Backend& b, Tensors& in) {
    const auto [loss, probs] = b.cross_entropy(in[0], in[1], smoothing);
    return Tensors{loss, probs, b.cross_entropy_backward(in[2], probs, in[1], smoothing)};
  };
  c.gradient = [smoothing](Backend& b, Tensors& in, const Tensor& g) {
    const auto [loss, probs] = b.cross_entropy(in[0], in[1], smoothing);
    return Tensors{b.cross_entropy_backward(g, probs, in[1], smoothing)};
  };
  c.differentiable = {0};
  c.device_dtypes = {DType::f32, DType::bf16};
  return c;
}

// The mask holds only 0 and 1 / (1 - p), and about p of it is 0, on each backend (their generators
// differ, so the masks do not match element by element).
std::string check_dropout_mask(const Tensors& reference, const Tensors& device, double p) {
  for (const Tensors* side : {&reference, &device}) {
    const std::vector<double> v = (*side)[0].to(Device::cpu()).to_vector<double>();
    int64_t zeros = 0;
    for (double x : v) {
      if (x == 0.0) {
        ++zeros;
      } else if (std::abs(x - 1.0 / (1.0 - p)) > 1e-2) {
        std::ostringstream why;
        why << "a mask value " << x << " is neither 0 nor " << 1.0 / (1.0 - p);
        return why.str();
      }
    }
    const double fraction = static_cast<double>(zeros) / static_cast<double>(v.size());
    if (std::abs(fraction - p) > 0.02)
      return "dropped fraction " + std::to_string(fraction) + ", expected " + std::to_string(p);
  }
  return "";
}

SgdParams sgd_params(bool nesterov) {
  SgdParams p;
  p.lr = 0.05, p.momentum = 0.9, p.weight_decay = 1e-2, p.nesterov = nesterov,
  p.dampening = nesterov ? 0.0 : 0.1;
  return p;
}

}  // namespace

std::vector<OpCase> loss_optim_cases() {
  std::vector<OpCase> cases;
  cases.push_back(cross_entropy_case(0.0));
  cases.push_back(cross_entropy_case(0.1));
  {
    OpCase c;
    c.name = "topk_correct (k = 1, 3) and argmax";
    c.inputs = {uniform({40, kK}), labels(40, kK)};
    c.run = [](Backend& b, Tensors& in) {
      return Tensors{b.topk_correct(in[0], in[1], 1), b.topk_correct(in[0], in[1], 3), b.argmax(in[0])};
    };
    c.device_dtypes = {DType::f32, DType::bf16};
    cases.push_back(c);
  }
  {
    OpCase c;
    c.name = "dropout_mask p = 0.3";
    c.inputs = {uniform({1})};  // for the device and dtype only
    c.run = [](Backend& b, Tensors& in) {
      Generator gen(5);
      return Tensors{b.dropout_mask({64, 257}, 0.3, in[0].dtype(), gen)};
    };
    c.compare = [](const Tensors& reference, const Tensors& device) {
      return check_dropout_mask(reference, device, 0.3);
    };
    c.device_dtypes = {DType::f32, DType::bf16};
    cases.push_back(c);
  }
  for (bool nesterov : {false, true}) {
    OpCase c;
    c.name =
        std::string("sgd_step, momentum") + (nesterov ? " + Nesterov" : " + dampening") + " + weight decay";
    // param, two gradients, the momentum buffer
    c.inputs = {uniform({7, 5}), uniform({7, 5}), uniform({7, 5}),
                InputSpec{{7, 5}, InputSpec::Values::zeros}};
    c.run = [nesterov](Backend& b, Tensors& in) {
      const SgdParams p = sgd_params(nesterov);
      b.sgd_step(in[0], in[1], in[3], true, p);  // the buffer starts as the gradient
      b.sgd_step(in[0], in[2], in[3], false, p);
      return Tensors{in[0], in[3]};
    };
    cases.push_back(c);
  }
  {
    OpCase c;
    c.name = "sgd_step_many over three tensors";
    c.inputs = {uniform({7, 5}), uniform({7, 5}),    uniform({13}),
                uniform({13}),   uniform({3, 4, 2}), uniform({3, 4, 2})};
    c.run = [](Backend& b, Tensors& in) {
      Tensors buffers{Tensor::zeros({7, 5}, in[0].dtype(), in[0].device()),
                      Tensor::zeros({13}, in[0].dtype(), in[0].device()),
                      Tensor::zeros({3, 4, 2}, in[0].dtype(), in[0].device())};
      std::vector<Backend::SgdUpdate> updates;
      for (size_t i = 0; i < 3; ++i) updates.push_back({&in[2 * i], &in[2 * i + 1], &buffers[i], true});
      b.sgd_step_many(updates, sgd_params(false));
      for (auto& u : updates) u.first_step = false;
      b.sgd_step_many(updates, sgd_params(false));
      return Tensors{in[0], in[2], in[4], buffers[0], buffers[1], buffers[2]};
    };
    cases.push_back(c);
  }
  {
    OpCase c;
    c.name = "adamw_step, two steps";
    c.inputs = {uniform({6, 7}), uniform({6, 7}), uniform({6, 7})};  // param, two grads
    c.run = [](Backend& b, Tensors& in) {
      Tensor m = Tensor::zeros(in[0].shape(), in[0].dtype(), in[0].device());
      Tensor v = Tensor::zeros(in[0].shape(), in[0].dtype(), in[0].device());
      AdamWParams p;
      p.lr = 0.01, p.weight_decay = 0.05;
      b.adamw_step(in[0], in[1], m, v, p);
      p.step = 2;
      b.adamw_step(in[0], in[2], m, v, p);
      return Tensors{in[0], m, v};
    };
    cases.push_back(c);
  }
  {
    // Two parameters a step apart (the second joins at step 2, as after a freeze): each keeps its own
    // bias correction inside one call.
    OpCase c;
    c.name = "adamw_step_many over two tensors a step apart";
    c.inputs = {uniform({6, 7}), uniform({6, 7}), uniform({6, 7}), uniform({13}), uniform({13})};
    c.run = [](Backend& b, Tensors& in) {
      auto zeros = [&](const Tensor& t) { return Tensor::zeros(t.shape(), t.dtype(), t.device()); };
      Tensor m0 = zeros(in[0]), v0 = zeros(in[0]), m1 = zeros(in[3]), v1 = zeros(in[3]);
      AdamWParams p;
      p.lr = 0.01, p.weight_decay = 0.05;
      b.adamw_step_many({{&in[0], &in[1], &m0, &v0, 1, nullptr, nullptr}}, p);
      b.adamw_step_many(
          {{&in[0], &in[2], &m0, &v0, 2, nullptr, nullptr}, {&in[3], &in[4], &m1, &v1, 1, nullptr, nullptr}},
          p);
      return Tensors{in[0], m0, v0, in[3], m1, v1};
    };
    cases.push_back(c);
  }
  {
    OpCase c;
    c.name = "count_updates, with and without a skip flag";
    c.inputs = {fixed({5}, DType::i64), fixed({1}, DType::i64)};
    c.run = [](Backend& b, Tensors& in) {
      b.count_updates(in[0], {0, 2, 3}, nullptr);
      b.count_updates(in[0], {1, 2}, in[1].data<int64_t>());  // flag 0: counted
      in[1].fill_(1.0);
      b.count_updates(in[0], {0, 4}, in[1].data<int64_t>());  // flag set: skipped
      return Tensors{in[0]};
    };
    cases.push_back(c);
  }
  return cases;
}

}  // namespace trainer::op_cases
