// The weight average's multi-tensor update (with its warm-up, copies, integer buffers, a skip flag and a
// closed gate), the squared-norm sum, gradient-norm clipping and timm's Lamb and Lars steps (clipping,
// trust ratios, momentum).
#include "op_case.h"

namespace trainer::op_cases {
namespace {

LambParams lamb_params(bool clip, bool trust_clip) {
  LambParams p;
  p.lr = 0.02, p.weight_decay = 0.05, p.trust_clip = trust_clip;
  p.max_grad_norm = clip ? 0.5 : 0.0;
  return p;
}

OpCase lamb_case(bool clip, bool trust_clip) {
  OpCase c;
  c.name = std::string("lamb_step, two steps") + (clip ? " + global clipping" : "") +
           (trust_clip ? " + trust clip" : "");
  // param, two gradients, the squared-norm accumulator
  c.inputs = {uniform({6, 7}), uniform({6, 7}), uniform({6, 7}), fixed({1}, DType::f64)};
  c.run = [clip, trust_clip](Backend& b, Tensors& in) {
    Tensor m = Tensor::zeros(in[0].shape(), in[0].dtype(), in[0].device());
    Tensor v = Tensor::zeros(in[0].shape(), in[0].dtype(), in[0].device());
    LambParams p = lamb_params(clip, trust_clip);
    for (int step = 1; step <= 2; ++step) {
      in[3].fill_(0.0);
      b.add_squared_norms({&in[step]}, in[3]);
      p.step = step;
      p.grad_sq_norm = clip ? static_cast<const double*>(in[3].raw_data()) : nullptr;
      b.lamb_step(in[0], in[step], m, v, p);
    }
    return Tensors{in[0], m, v};
  };
  return c;
}

OpCase lars_case(bool nesterov, bool trust_clip, double weight_decay) {
  OpCase c;
  c.name = std::string("lars_step, two steps") + (nesterov ? " + Nesterov" : " + dampening") +
           (trust_clip ? " + trust clip" : "") + (weight_decay == 0.0 ? ", no adaptation" : "");
  c.inputs = {uniform({7, 5}), uniform({7, 5}), uniform({7, 5})};  // param, two gradients
  c.run = [=](Backend& b, Tensors& in) {
    Tensor buf = Tensor::zeros(in[0].shape(), in[0].dtype(), in[0].device());
    LarsParams p;
    p.lr = 0.1, p.momentum = 0.9, p.dampening = nesterov ? 0.0 : 0.1, p.nesterov = nesterov;
    p.weight_decay = weight_decay, p.trust_coeff = 0.02, p.trust_clip = trust_clip;
    b.lars_step(in[0], in[1], buf, true, p);
    b.lars_step(in[0], in[2], buf, false, p);
    return Tensors{in[0], buf};
  };
  return c;
}

}  // namespace

std::vector<OpCase> layerwise_optim_cases() {
  std::vector<OpCase> cases;
  {
    OpCase c;
    c.name = "ema_update: warm-up decays, a copied buffer, an integer buffer, a skip flag, a closed gate";
    // two averages and their values, a copied buffer and its value, an i64 buffer and its value, the
    // update count, the skip flag, the gate
    c.inputs = {uniform({7, 5}),        uniform({7, 5}),        uniform({13}),         uniform({13}),
                uniform({3}),           uniform({3}),           labels(2, 9),          labels(2, 9),
                fixed({1}, DType::i64), fixed({1}, DType::i64), fixed({1}, DType::i64)};
    c.run = [](Backend& b, Tensors& in) {
      std::vector<Backend::EmaPair> pairs{
          {&in[0], &in[1], false}, {&in[2], &in[3], false}, {&in[4], &in[5], true}, {&in[6], &in[7], false}};
      EmaParams p;
      p.rule.decay = 0.9, p.rule.warmup = true, p.rule.every_steps = 2;
      for (int i = 0; i < 3; ++i) {
        b.ema_update(pairs, in[8], p);
        in[1] = b.binary_scalar(BinaryOp::mul, in[1], -0.5, false);  // the model moves on
        pairs[0].value = &in[1];
      }
      p.skip_if = in[9].data<int64_t>();
      in[9].fill_(1.0);
      b.ema_update(pairs, in[8], p);  // skipped: nothing changes
      p.skip_if = nullptr;
      p.gate = in[10].data<int64_t>();  // zero: not this step
      b.ema_update(pairs, in[8], p);
      return Tensors{in[0], in[2], in[4], in[6], in[8]};
    };
    cases.push_back(c);
  }
  {
    OpCase c;
    c.name = "add_squared_norms over two tensors, accumulated twice";
    c.inputs = {uniform({7, 5}), uniform({13}), fixed({1}, DType::f64)};
    c.run = [](Backend& b, Tensors& in) {
      b.add_squared_norms({&in[0], &in[1]}, in[2]);
      b.add_squared_norms({&in[1]}, in[2]);
      return Tensors{in[2]};
    };
    cases.push_back(c);
  }
  // Clipping: several chunks of one tensor (16384 elements a block on the GPU), a channels-last image
  // tensor, a norm below the limit, and more tensors than one GPU launch takes (48).
  struct ClipSetup {
    const char* what;
    std::vector<Shape> shapes;
    double max_norm;
    bool image = false;
  };
  for (const ClipSetup& setup :
       {ClipSetup{"over three tensors, one of three chunks, clipped", {{7, 5}, {13}, {40000}}, 1.0},
        ClipSetup{"of a norm below the limit", {{7, 5}, {13}}, 100.0},
        ClipSetup{"of a channels-last [2, 3, 4, 5] tensor", {{2, 3, 4, 5}, {6}}, 0.5, true},
        ClipSetup{"over 50 tensors", std::vector<Shape>(50, Shape{9}), 2.0}}) {
    OpCase c;
    c.name = std::string("clip_by_total_norm ") + setup.what;
    for (const Shape& shape : setup.shapes)
      c.inputs.push_back(shape.size() == 4 ? image(shape) : uniform(shape));
    c.inputs.push_back(fixed({1}, DType::f64));  // the norm
    c.channels_last = setup.image;
    c.run = [max_norm = setup.max_norm](Backend& b, Tensors& in) {
      std::vector<Tensor*> grads;
      for (size_t i = 0; i + 1 < in.size(); ++i) grads.push_back(&in[i]);
      b.clip_by_total_norm(grads, max_norm, in.back());
      return in;
    };
    cases.push_back(c);
  }
  cases.push_back(lamb_case(true, false));
  cases.push_back(lamb_case(false, true));
  cases.push_back(lars_case(false, false, 1e-3));
  cases.push_back(lars_case(true, true, 1e-3));
  cases.push_back(lars_case(false, false, 0.0));
  return cases;
}

}  // namespace trainer::op_cases
