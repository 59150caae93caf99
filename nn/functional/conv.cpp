#include "nn/amp/autocast.h"
#include "nn/functional.h"

namespace trainer::F {

Variable conv2d(const Variable& x, const Variable& weight, const Variable& bias, const Conv2dParams& p) {
  if (autocast_applies({x.dtype(), weight.dtype(), bias.defined() ? bias.dtype() : x.dtype()})) {
    // The half weight is made in the input's layout, so cuDNN does not convert it again.
    const DType half = *autocast_dtype();
    return conv2d(to_dtype(x, half), to_dtype(weight, half, x.data().suggest_memory_format()),
                  to_dtype(bias, half), p);
  }
  Backend& k = backend_for(x.data());
  const bool has_bias = bias.defined();
  Tensor y = k.conv2d(x.data(), weight.data(), has_bias ? bias.data() : Tensor(), p);  // [N, O, OH, OW]
  std::vector<Variable> inputs{x, weight};
  if (has_bias) inputs.push_back(bias);
  // grad_x needs only the weight and grad_w only the input: keep neither when its gradient is not wanted
  // (the first layer's input never needs one).
  const bool need_dx = x.requires_grad(), need_dw = weight.requires_grad();
  const bool need_db = has_bias && bias.requires_grad();
  const Tensor saved_w = need_dx ? weight.data() : Tensor();
  const Tensor saved_x = need_dw ? x.data() : Tensor();
  const Shape x_shape = x.shape(), w_shape = weight.shape();
  return record_op(
      "conv2d", y, std::move(inputs),
      [saved_x, saved_w, x_shape, w_shape, p, has_bias, need_db](const Tensor& g) -> std::vector<Tensor> {
        Backend& k = backend_for(g);
        const Tensor dx = saved_w.defined() ? k.conv2d_backward_input(g, saved_w, x_shape, p) : Tensor();
        // Where one kernel pass gives both the weight and the bias gradient (GPU depthwise), take it.
        if (saved_x.defined() && need_db)
          if (auto both = k.conv2d_weight_and_bias_grads_fused(g, saved_x, w_shape, p))
            return {dx, both->first, both->second};
        std::vector<Tensor> grads{
            dx, saved_x.defined() ? k.conv2d_backward_weight(g, saved_x, w_shape, p) : Tensor()};
        if (has_bias) grads.push_back(need_db ? k.sum(g, {0, 2, 3}, false) : Tensor());
        return grads;
      });
}

}  // namespace trainer::F
