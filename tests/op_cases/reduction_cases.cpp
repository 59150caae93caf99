// Reductions and the loss scaler's kernels: sum over dims, broadcast_to, all_finite, the non-finite
// flags of scaling and unscaling, and GradScaler's update on the device.
#include <cmath>
#include <limits>

#include "op_case.h"

namespace trainer::op_cases {
namespace {

OpCase sum_case(Shape shape, std::vector<int> dims, bool keepdim) {
  OpCase c;
  std::string dims_text;
  for (int d : dims) dims_text += (dims_text.empty() ? "" : ",") + std::to_string(d);
  c.name = "sum " + shape_str(shape) + " over {" + dims_text + "}" + (keepdim ? " keepdim" : "");
  c.inputs = {uniform(shape)};
  c.run = [dims, keepdim](Backend& b, Tensors& in) { return Tensors{b.sum(in[0], dims, keepdim)}; };
  c.gradient = [dims, keepdim](Backend& b, Tensors& in, const Tensor& g) {
    // The seed, with the summed dimensions back as size 1, broadcast to the input.
    Shape kept = in[0].shape();
    for (int d : dims) kept[static_cast<size_t>(d)] = 1;
    return Tensors{b.broadcast_to(g.reshape(kept), in[0].shape())};
  };
  c.differentiable = {0};
  c.device_dtypes = {DType::f32, DType::bf16};
  c.rtol_f32 = 1e-5;
  return c;
}

// The non-finite value that the flag cases plant in element 3 (nothing for `finite`).
void plant(Tensor& t, double value) {
  Tensor one = Tensor::full({1}, value, t.dtype(), t.device());
  Tensor at = t.reshape({t.numel()}).slice(0, 3, 4);
  at.copy_(one);
}

}  // namespace

std::vector<OpCase> reduction_cases() {
  std::vector<OpCase> cases;
  cases.push_back(sum_case({4, 5, 6}, {0, 1, 2}, false));
  cases.push_back(sum_case({4, 5, 6}, {1}, true));
  cases.push_back(sum_case({3, 4, 5, 6}, {0, 2, 3}, true));  // per-channel sums
  cases.push_back(sum_case({300, 7}, {0}, false));           // a long reduction
  {
    OpCase c;
    c.name = "broadcast_to [3, 1, 5] -> [2, 3, 4, 5]";
    c.inputs = {uniform({3, 1, 5})};
    c.run = [](Backend& b, Tensors& in) { return Tensors{b.broadcast_to(in[0], {2, 3, 4, 5})}; };
    c.gradient = [](Backend& b, Tensors&, const Tensor& g) {
      return Tensors{b.sum(g, {0, 2}, true).reshape({3, 1, 5})};
    };
    c.differentiable = {0};
    c.device_dtypes = {DType::f32, DType::bf16};
    cases.push_back(c);
  }
  for (double planted : {0.0, std::numeric_limits<double>::infinity(), std::nan("")}) {
    const std::string what = planted == 0.0 ? "finite" : std::isnan(planted) ? "a NaN" : "an inf";
    {
      OpCase c;
      c.name = "all_finite, " + what;
      c.inputs = {uniform({9, 13})};
      c.run = [planted](Backend& b, Tensors& in) {
        if (planted != 0.0) plant(in[0], planted);
        return Tensors{Tensor::scalar(b.all_finite(in[0]) ? 1.0 : 0.0, DType::i64)};
      };
      c.device_dtypes = {DType::f32, DType::bf16};
      cases.push_back(c);
    }
    {
      OpCase c;
      c.name = "scale_and_flag_nonfinite and unscale_and_flag_nonfinite, " + what;
      c.inputs = {uniform({9, 13}), uniform({5, 3}), fixed({1}, DType::i64), fixed({1}, DType::i64)};
      c.run = [planted](Backend& b, Tensors& in) {
        if (planted != 0.0) plant(in[0], planted);
        b.scale_and_flag_nonfinite(in[0], 0.25, in[2]);
        Tensor scale = Tensor::full({1}, 512.0, DType::f32, in[1].device());
        b.unscale_and_flag_nonfinite(in[1], scale, in[3]);  // finite: its flag stays 0
        return Tensors{in[0], in[1], in[2], in[3]};
      };
      c.device_dtypes = {DType::f32, DType::bf16};
      cases.push_back(c);
    }
  }
  {
    // GradScaler's rule over six steps: clean steps grow the scale at the interval, a flagged one backs
    // off and counts as skipped, and the flag is cleared after each update.
    OpCase c;
    c.name = "update_loss_scale";
    c.inputs = {fixed({1}, DType::i64), fixed({1}, DType::i64), fixed({1}, DType::f64)};
    c.run = [](Backend& b, Tensors& in) {
      Tensor scale = Tensor::full({1}, 1024.0, DType::f32, in[0].device());
      Tensor& tracker = in[0];
      Tensor& flag = in[1];
      Tensor& skipped = in[2];
      LossScaleRule rule;
      rule.growth_interval = 2;
      Tensors trace;
      for (int step = 0; step < 6; ++step) {
        if (step == 3) flag.fill_(1.0);
        b.update_loss_scale(scale, tracker, skipped, flag, rule);
        trace.push_back(scale.clone());
        trace.push_back(tracker.clone());
        trace.push_back(flag.clone());
      }
      trace.push_back(skipped);
      return trace;
    };
    cases.push_back(c);
  }
  return cases;
}

}  // namespace trainer::op_cases
