#include "app/commands/export/onnx_layers.h"

#include <cmath>

namespace trainer::onnx_layers {

using Ints = std::vector<int64_t>;

std::string conv(OnnxGraph& g, const std::string& x, const std::string& prefix, int64_t stride,
                 int64_t padding, int64_t groups) {
  const Tensor& w = g.weight_tensor(prefix + ".weight");  // [out, in / groups, k, k]
  std::vector<std::string> inputs = {x, g.weight(prefix + ".weight")};
  if (g.has_weight(prefix + ".bias")) inputs.push_back(g.weight(prefix + ".bias"));
  return g.node("Conv", inputs,
                {{"kernel_shape", Ints{w.size(2), w.size(3)}},
                 {"strides", Ints{stride, stride}},
                 {"pads", Ints{padding, padding, padding, padding}},
                 {"group", groups}},
                prefix);
}

std::string batch_norm(OnnxGraph& g, const std::string& x, const std::string& prefix, float eps) {
  return g.node("BatchNormalization",
                {x, g.weight(prefix + ".weight"), g.weight(prefix + ".bias"),
                 g.weight(prefix + ".running_mean"), g.weight(prefix + ".running_var")},
                {{"epsilon", eps}}, prefix);
}

std::string relu(OnnxGraph& g, const std::string& x) { return g.node("Relu", {x}); }

std::string max_pool(OnnxGraph& g, const std::string& x, int64_t kernel, int64_t stride, int64_t padding) {
  return g.node("MaxPool", {x},
                {{"kernel_shape", Ints{kernel, kernel}},
                 {"strides", Ints{stride, stride}},
                 {"pads", Ints{padding, padding, padding, padding}}});
}

std::string global_avg_pool_flat(OnnxGraph& g, const std::string& x) {
  return g.node("Flatten", {g.node("GlobalAveragePool", {x})}, {{"axis", int64_t{1}}});
}

std::string linear(OnnxGraph& g, const std::string& x, const std::string& prefix) {
  return g.node("Gemm", {x, g.weight(prefix + ".weight"), g.weight(prefix + ".bias")},
                {{"transB", int64_t{1}}}, prefix);
}

std::string linear_tokens(OnnxGraph& g, const std::string& x, const std::string& prefix) {
  // The weight's transpose is a constant: runtimes fold it when they load the graph.
  const std::string wt = g.node("Transpose", {g.weight(prefix + ".weight")}, {{"perm", Ints{1, 0}}});
  return g.node("Add", {g.node("MatMul", {x, wt}), g.weight(prefix + ".bias")}, {}, prefix);
}

std::string layer_norm(OnnxGraph& g, const std::string& x, const std::string& prefix, float eps) {
  return g.node("LayerNormalization", {x, g.weight(prefix + ".weight"), g.weight(prefix + ".bias")},
                {{"axis", int64_t{-1}}, {"epsilon", eps}}, prefix);
}

std::string layer_norm_2d(OnnxGraph& g, const std::string& x, const std::string& prefix, float eps) {
  const std::string nhwc = g.node("Transpose", {x}, {{"perm", Ints{0, 2, 3, 1}}});
  return g.node("Transpose", {layer_norm(g, nhwc, prefix, eps)}, {{"perm", Ints{0, 3, 1, 2}}});
}

std::string gelu(OnnxGraph& g, const std::string& x, F::GeluApproximation form) {
  std::string inner;
  if (form == F::GeluApproximation::tanh) {
    const std::string cube = g.node("Mul", {g.node("Mul", {x, x}), x});
    const std::string poly = g.node("Add", {x, g.node("Mul", {cube, g.scalar("gelu_c", 0.044715f)})});
    inner = g.node("Tanh", {g.node("Mul", {poly, g.scalar("gelu_sqrt_2_over_pi", std::sqrt(2.0f / M_PIf))})});
  } else {
    inner = g.node("Erf", {g.node("Div", {x, g.scalar("gelu_sqrt2", std::sqrt(2.0f))})});
  }
  const std::string one_plus = g.node("Add", {inner, g.scalar("gelu_one", 1.0f)});
  return g.node("Mul", {g.node("Mul", {x, g.scalar("gelu_half", 0.5f)}), one_plus}, {}, "gelu");
}

std::string self_attention(OnnxGraph& g, const std::string& x, const std::string& prefix, int64_t heads) {
  const Tensor& w = g.weight_tensor(prefix + ".in_proj_weight");  // [3D, D]
  const int64_t d = w.size(1), head_dim = d / heads;
  const std::string wt = g.node("Transpose", {g.weight(prefix + ".in_proj_weight")}, {{"perm", Ints{1, 0}}});
  const std::string qkv =
      g.node("Add", {g.node("MatMul", {x, wt}), g.weight(prefix + ".in_proj_bias")});  // [N, T, 3D]
  // [N, T, 3, H, hd] -> [3, N, H, T, hd]: q, k and v by Gather along the first axis.
  const std::string split =
      g.node("Transpose", {g.node("Reshape", {qkv, g.int64s("qkv_shape", {0, 0, 3, heads, head_dim})})},
             {{"perm", Ints{2, 0, 3, 1, 4}}});
  const auto part = [&](int64_t which, const char* name) {
    return g.node("Gather", {split, g.int64s("index", {which})}, {{"axis", int64_t{0}}}, prefix + "." + name);
  };
  // Gather with a 1-element index keeps the axis: [1, N, H, T, hd] -> squeezed below.
  const std::string axis0 = g.int64s("axis0", {0});
  const std::string q = g.node("Squeeze", {part(0, "q"), axis0}),
                    k = g.node("Squeeze", {part(1, "k"), axis0}),
                    v = g.node("Squeeze", {part(2, "v"), axis0});
  const std::string kt = g.node("Transpose", {k}, {{"perm", Ints{0, 1, 3, 2}}});
  const std::string scores = g.node(
      "Mul", {g.node("MatMul", {q, kt}), g.scalar("attention_scale", 1.0f / std::sqrt(float(head_dim)))});
  const std::string attended = g.node("MatMul", {g.node("Softmax", {scores}, {{"axis", int64_t{-1}}}), v});
  const std::string joined = g.node("Reshape", {g.node("Transpose", {attended}, {{"perm", Ints{0, 2, 1, 3}}}),
                                                g.int64s("tokens_shape", {0, 0, d})});
  return linear_tokens(g, joined, prefix + ".out_proj");
}

}  // namespace trainer::onnx_layers
