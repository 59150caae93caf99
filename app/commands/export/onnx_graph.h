#pragma once
// The ONNX graph under construction: one onnx::GraphProto (libonnx-dev's protobuf class) that nodes and
// initializers are added to, with unique value names. Weights keep their state-dict names
// ("layer1.0.conv1.weight"), so the graph reads like the model. The graph computes in `compute`
// (float32, or float16 for --fp16): weights and constants are stored in it; the exporter casts at the
// graph's input and output.
#include <onnx/onnx_pb.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "nn/tensor.h"

namespace trainer {

using OnnxAttribute = std::variant<int64_t, float, std::vector<int64_t>>;
using OnnxAttributes = std::vector<std::pair<std::string, OnnxAttribute>>;

class OnnxGraph {
 public:
  // `weights`: the model's state dict (host tensors), looked up by weight().
  OnnxGraph(onnx::GraphProto& graph, std::map<std::string, Tensor> weights,
            onnx::TensorProto::DataType compute);

  onnx::TensorProto::DataType compute_type() const { return compute_; }
  bool has_weight(const std::string& name) const { return weights_.count(name) > 0; }
  const Tensor& weight_tensor(const std::string& name) const;  // throws naming a missing weight
  // The state-dict tensor `name` as an initializer in the compute type (added once); `dims` replaces
  // its shape when given (same element count).
  std::string weight(const std::string& name, const std::vector<int64_t>& dims = {});
  // A constant of the compute type (float32 when `float32`), and an int64 one.
  std::string constant(const std::string& hint, const std::vector<float>& values,
                       const std::vector<int64_t>& dims, bool float32 = false);
  std::string int64s(const std::string& hint, const std::vector<int64_t>& values);
  std::string scalar(const std::string& hint, float value) { return constant(hint, {value}, {}); }

  // Adds a node; returns its (first) output's name, made unique from `hint` (or the op type).
  std::string node(const std::string& op, const std::vector<std::string>& inputs,
                   const OnnxAttributes& attributes = {}, const std::string& hint = "");

  // The weights the graph never used: a model whose emitter skipped a tensor is a wrong graph.
  std::vector<std::string> unused_weights() const;

 private:
  std::string unique(const std::string& hint);
  onnx::TensorProto& add_initializer(const std::string& name, onnx::TensorProto::DataType type,
                                     const std::vector<int64_t>& dims);

  onnx::GraphProto& graph_;
  std::map<std::string, Tensor> weights_;
  onnx::TensorProto::DataType compute_;
  std::set<std::string> names_, used_;
};

}  // namespace trainer
