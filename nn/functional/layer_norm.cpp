// Layer norm over the dimension innermost in memory (nn/functional.h says which that is).
//
// Autocast: PyTorch's autocast runs layer_norm in f32 (its fp32 list). As with batch norm here
// (nn/amp/autocast.h), a half input is not cast: the kernels compute in f32 from f32 statistics and
// read the f32 weight and bias, and only the output is rounded to the half dtype -- where PyTorch's
// f32 output is rounded too, when the Linear that follows a transformer's or a ConvNeXt block's
// LayerNorm casts it for the tensor cores. The activation stays half-sized, and no cast pass runs
// either way.
#include <stdexcept>
#include <string>

#include "nn/functional.h"

namespace trainer::F {
namespace {

// Throws unless x's memory reads as rows of normalized_size along the dimension F::layer_norm
// normalises: dense, with that dimension innermost and of that size.
void check_normalized_dimension(const Tensor& x, int64_t normalized_size) {
  const MemoryFormat format = x.dim() > 0 ? x.suggest_memory_format() : MemoryFormat::contiguous;
  const bool channels_last = format == MemoryFormat::channels_last;
  const bool dense = x.dim() > 0 && x.is_contiguous(format);
  if (dense && x.size(channels_last ? 1 : x.dim() - 1) == normalized_size) return;
  const std::string layout = !dense ? "non-dense" : channels_last ? "channels-last" : "contiguous";
  throw std::invalid_argument(
      "layer_norm: normalises over the dimension innermost in memory (the last of a contiguous tensor, C "
      "of a channels-last [N, C, H, W] one), which must have normalized_size = " +
      std::to_string(normalized_size) + " elements; got a " + layout + " " + shape_str(x.shape()) +
      " input with strides " + shape_str(x.strides()) +
      ". HINT: over the last dimension, pass F::contiguous(x); over the channels of an image batch, "
      "F::contiguous(x, MemoryFormat::channels_last)");
}

}  // namespace

Variable layer_norm(const Variable& x, int64_t normalized_size, const Variable& weight, const Variable& bias,
                    double eps, std::optional<DType> y_dtype) {
  const Tensor xd = x.data();
  check_normalized_dimension(xd, normalized_size);
  if (!(eps >= 0.0)) throw std::invalid_argument("layer_norm: eps must be non-negative");
  const Tensor wd = weight.defined() ? weight.data() : Tensor();
  const Tensor bd = bias.defined() ? bias.data() : Tensor();
  const LayerNormForward f =
      backend_for(xd).layer_norm(xd, normalized_size, wd, bd, eps, y_dtype.value_or(xd.dtype()));
  std::vector<Variable> inputs{x};
  if (wd.defined()) inputs.push_back(weight);
  if (bd.defined()) inputs.push_back(bias);
  const DType weight_dtype = wd.defined() ? wd.dtype() : xd.dtype();
  const DType bias_dtype = bd.defined() ? bd.dtype() : xd.dtype();
  const bool has_bias = bd.defined();
  return record_op("layer_norm", f.y, inputs,
                   [xd, wd, mean = f.mean, rstd = f.rstd, has_bias, weight_dtype,
                    bias_dtype](const Tensor& g) -> std::vector<Tensor> {
                     const LayerNormGrads grads = backend_for(g).layer_norm_backward(g, xd, mean, rstd, wd);
                     std::vector<Tensor> out{grads.grad_x};
                     if (wd.defined()) out.push_back(grads.grad_gamma.to(weight_dtype));
                     if (has_bias) out.push_back(grads.grad_beta.to(bias_dtype));
                     return out;
                   });
}

std::pair<Variable, Variable> add_layer_norm(const Variable& x, const Variable& branch,
                                             int64_t normalized_size, const Variable& weight,
                                             const Variable& bias, double eps, std::optional<DType> y_dtype) {
  const Tensor xd = x.data(), bd_branch = branch.data();
  const Tensor wd = weight.defined() ? weight.data() : Tensor();
  const Tensor bd = bias.defined() ? bias.data() : Tensor();
  std::optional<AddLayerNormForward> f;
  if (xd.shape() == bd_branch.shape() && eps >= 0.0)
    f = backend_for(xd).add_layer_norm(xd, bd_branch, normalized_size, wd, bd, eps,
                                       y_dtype.value_or(xd.dtype()));
  if (!f) {
    const Variable h = add(x, branch);
    return {h, layer_norm(h, normalized_size, weight, bias, eps, y_dtype)};
  }
  std::vector<Variable> inputs{x, branch};
  if (wd.defined()) inputs.push_back(weight);
  if (bd.defined()) inputs.push_back(bias);
  const DType branch_dtype = bd_branch.dtype();
  const DType weight_dtype = wd.defined() ? wd.dtype() : xd.dtype();
  const DType bias_dtype = bd.defined() ? bd.dtype() : xd.dtype();
  const bool has_bias = bd.defined();
  std::vector<Variable> hy = record_op_multi(
      "add_layer_norm", {f->h, f->y}, std::move(inputs),
      [h = f->h, wd, mean = f->mean, rstd = f->rstd, has_bias, branch_dtype, weight_dtype,
       bias_dtype](const std::vector<Tensor>& g) -> std::vector<Tensor> {
        const Tensor &grad_h = g[0], &grad_y = g[1];
        std::vector<Tensor> out;
        if (!grad_y.defined()) {  // only the sum was used: add's backward
          out = {grad_h, grad_h.to(branch_dtype)};
          if (wd.defined()) out.emplace_back();
          if (has_bias) out.emplace_back();
          return out;
        }
        const std::optional<AddLayerNormGrads> grads =
            backend_for(grad_y).add_layer_norm_backward(grad_y, grad_h, h, mean, rstd, wd, branch_dtype);
        if (!grads)
          throw std::logic_error("add_layer_norm: the backend fused the forward but not its backward");
        out = {grads->grad_x, grads->grad_branch};
        if (wd.defined()) out.push_back(grads->grad_gamma.to(weight_dtype));
        if (has_bias) out.push_back(grads->grad_beta.to(bias_dtype));
        return out;
      });
  return {hy[0], hy[1]};
}

}  // namespace trainer::F
