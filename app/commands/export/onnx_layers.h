#pragma once
// The ONNX nodes of each module the shipped models are made of (nn/modules/), in opset 17, reading the
// module's weights by its state-dict prefix ("layer1.0.conv1"). Each returns its output's name. The
// shapes are PyTorch's: images [N, C, H, W], tokens [N, T, D]; N stays symbolic.
#include <cstdint>
#include <string>

#include "app/commands/export/onnx_graph.h"
#include "nn/functional.h"

namespace trainer::onnx_layers {

// Conv2d (bias when the weights hold one); the kernel size comes from the weight.
std::string conv(OnnxGraph& g, const std::string& x, const std::string& prefix, int64_t stride,
                 int64_t padding, int64_t groups = 1);
// BatchNorm2d in eval mode: the running statistics.
std::string batch_norm(OnnxGraph& g, const std::string& x, const std::string& prefix, float eps = 1e-5f);
std::string relu(OnnxGraph& g, const std::string& x);
std::string max_pool(OnnxGraph& g, const std::string& x, int64_t kernel, int64_t stride, int64_t padding);
// AdaptiveAvgPool2d(1) + flatten: [N, C, H, W] -> [N, C].
std::string global_avg_pool_flat(OnnxGraph& g, const std::string& x);
// Linear on [N, in] (Gemm) and on [N, T, in] (MatMul by the transposed weight, + bias).
std::string linear(OnnxGraph& g, const std::string& x, const std::string& prefix);
std::string linear_tokens(OnnxGraph& g, const std::string& x, const std::string& prefix);
// LayerNorm over the last dimension (LayerNormalization, opset 17), and over C of [N, C, H, W]
// (torchvision's LayerNorm2d: transposed to channels-last around it).
std::string layer_norm(OnnxGraph& g, const std::string& x, const std::string& prefix, float eps);
std::string layer_norm_2d(OnnxGraph& g, const std::string& x, const std::string& prefix, float eps);
// GELU composed of opset-17 ops: x * 0.5 * (1 + erf(x / sqrt 2)) or the tanh approximation
// x * 0.5 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3))), as the model computes it.
std::string gelu(OnnxGraph& g, const std::string& x, F::GeluApproximation form);
// nn.MultiheadAttention(D, heads) as self-attention over [N, T, D]: the packed in_proj, softmax of
// q k^T / sqrt(D / heads) per head, out_proj.
std::string self_attention(OnnxGraph& g, const std::string& x, const std::string& prefix, int64_t heads);

}  // namespace trainer::onnx_layers
