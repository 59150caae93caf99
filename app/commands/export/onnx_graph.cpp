#include "app/commands/export/onnx_graph.h"

#include <stdexcept>

#include "nn/dtype.h"

namespace trainer {
namespace {

// Values as the raw little-endian bytes of `type` (float32 or float16).
std::string float_bytes(const std::vector<float>& values, onnx::TensorProto::DataType type) {
  if (type == onnx::TensorProto::FLOAT)
    return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  std::vector<uint16_t> halves;
  halves.reserve(values.size());
  for (float v : values) halves.push_back(float_to_half(v));
  return std::string(reinterpret_cast<const char*>(halves.data()), halves.size() * sizeof(uint16_t));
}

void set_attribute(onnx::NodeProto& node, const std::string& name, const OnnxAttribute& value) {
  onnx::AttributeProto& a = *node.add_attribute();
  a.set_name(name);
  if (const auto* i = std::get_if<int64_t>(&value)) {
    a.set_type(onnx::AttributeProto::INT);
    a.set_i(*i);
  } else if (const auto* f = std::get_if<float>(&value)) {
    a.set_type(onnx::AttributeProto::FLOAT);
    a.set_f(*f);
  } else {
    a.set_type(onnx::AttributeProto::INTS);
    for (int64_t v : std::get<std::vector<int64_t>>(value)) a.add_ints(v);
  }
}

}  // namespace

OnnxGraph::OnnxGraph(onnx::GraphProto& graph, std::map<std::string, Tensor> weights,
                     onnx::TensorProto::DataType compute)
    : graph_(graph), weights_(std::move(weights)), compute_(compute) {}

const Tensor& OnnxGraph::weight_tensor(const std::string& name) const {
  const auto it = weights_.find(name);
  if (it == weights_.end()) throw std::runtime_error("export: the weights have no tensor '" + name + "'");
  return it->second;
}

std::string OnnxGraph::unique(const std::string& hint) {
  std::string name = hint;
  for (int k = 1; names_.count(name); ++k) name = hint + "_" + std::to_string(k);
  names_.insert(name);
  return name;
}

onnx::TensorProto& OnnxGraph::add_initializer(const std::string& name, onnx::TensorProto::DataType type,
                                              const std::vector<int64_t>& dims) {
  onnx::TensorProto& t = *graph_.add_initializer();
  t.set_name(name);
  t.set_data_type(type);
  for (int64_t d : dims) t.add_dims(d);
  return t;
}

std::string OnnxGraph::weight(const std::string& name, const std::vector<int64_t>& dims) {
  const Tensor& tensor = weight_tensor(name);
  const std::string key = dims.empty() ? name : name + ":" + std::to_string(dims.size()) + "d";
  if (used_.count(key)) return key;
  used_.insert(name);
  used_.insert(key);
  names_.insert(key);
  std::vector<int64_t> shape = dims;
  if (shape.empty())
    for (int64_t d : tensor.shape()) shape.push_back(d);
  add_initializer(key, compute_, shape).set_raw_data(float_bytes(tensor.to_vector<float>(), compute_));
  return key;
}

std::string OnnxGraph::constant(const std::string& hint, const std::vector<float>& values,
                                const std::vector<int64_t>& dims, bool float32) {
  const std::string name = unique(hint);
  const auto type = float32 ? onnx::TensorProto::FLOAT : compute_;
  add_initializer(name, type, dims).set_raw_data(float_bytes(values, type));
  return name;
}

std::string OnnxGraph::int64s(const std::string& hint, const std::vector<int64_t>& values) {
  const std::string name = unique(hint);
  add_initializer(name, onnx::TensorProto::INT64, {static_cast<int64_t>(values.size())})
      .set_raw_data(
          std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(int64_t)));
  return name;
}

std::string OnnxGraph::node(const std::string& op, const std::vector<std::string>& inputs,
                            const OnnxAttributes& attributes, const std::string& hint) {
  onnx::NodeProto& n = *graph_.add_node();
  const std::string output = unique(hint.empty() ? op : hint);
  n.set_op_type(op);
  n.set_name(output);
  for (const std::string& input : inputs) n.add_input(input);
  n.add_output(output);
  for (const auto& [name, value] : attributes) set_attribute(n, name, value);
  return output;
}

std::vector<std::string> OnnxGraph::unused_weights() const {
  std::vector<std::string> unused;
  for (const auto& [name, tensor] : weights_)
    if (!used_.count(name) && !name.ends_with("num_batches_tracked")) unused.push_back(name);
  return unused;
}

}  // namespace trainer
