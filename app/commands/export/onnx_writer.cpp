#include "app/commands/export/onnx_writer.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "app/commands/export/onnx_graph.h"
#include "app/commands/export/onnx_models.h"
#include "app/common/build_info.h"

namespace trainer {
namespace {

constexpr int64_t kOpset = 17;  // LayerNormalization's first opset; ONNX 1.12's newest

void set_float_value(onnx::ValueInfoProto& value, const std::string& name,
                     const std::vector<std::string>& dims, int64_t first_known) {
  value.set_name(name);
  onnx::TypeProto_Tensor& t = *value.mutable_type()->mutable_tensor_type();
  t.set_elem_type(onnx::TensorProto::FLOAT);
  for (size_t i = 0; i < dims.size(); ++i) {
    onnx::TensorShapeProto_Dimension& d = *t.mutable_shape()->add_dim();
    if (i < static_cast<size_t>(first_known))
      d.set_dim_param(dims[i]);
    else
      d.set_dim_value(std::stoll(dims[i]));
  }
}

void add_metadata(onnx::ModelProto& m, const std::string& key, const std::string& value) {
  onnx::StringStringEntryProto& e = *m.add_metadata_props();
  e.set_key(key);
  e.set_value(value);
}

std::map<std::string, Tensor> host_state(Module& model) {
  std::map<std::string, Tensor> weights;
  for (const auto& e : model.state_dict())
    weights[e.name] = e.tensor->to(Device::cpu()).to(DType::f32).contiguous();
  return weights;
}

// pixels -> Sub(mean) -> Div(std) (float32) -> Cast to the compute type when it is float16.
std::string normalized_input(OnnxGraph& g, const EvalTransform& t) {
  const int64_t c = static_cast<int64_t>(t.mean.size());
  const std::string centred = g.node("Sub", {"pixels", g.constant("mean", t.mean, {1, c, 1, 1}, true)});
  const std::string scaled =
      g.node("Div", {centred, g.constant("std", t.std, {1, c, 1, 1}, true)}, {}, "normalized");
  if (g.compute_type() == onnx::TensorProto::FLOAT) return scaled;
  return g.node("Cast", {scaled}, {{"to", int64_t{g.compute_type()}}});
}

}  // namespace

OnnxExportReport write_onnx(const std::string& path, Module& model, const ModelOptions& options,
                            const ModelCard& card, const OnnxExportOptions& export_options) {
  onnx::ModelProto m;
  m.set_ir_version(onnx::IR_VERSION);  // 8 in ONNX 1.12
  m.set_producer_name("trainer");
  m.set_producer_version(trainer_build().str());
  m.set_doc_string("Image classifier '" + options.name +
                   "'. Input pixels: float32 [N, C, H, W] in [0, 1] after the eval_transform's Resize and "
                   "CenterCrop; the normalisation is inside the graph. Output: logits [N, classes].");
  onnx::OperatorSetIdProto& opset = *m.add_opset_import();
  opset.set_domain("");
  opset.set_version(kOpset);
  onnx::GraphProto& graph = *m.mutable_graph();
  graph.set_name(options.name);
  const auto compute = export_options.fp16 ? onnx::TensorProto::FLOAT16 : onnx::TensorProto::FLOAT;
  OnnxGraph g(graph, host_state(model), compute);
  const EvalTransform& t = card.transform;
  const std::string size = std::to_string(t.crop);
  set_float_value(*graph.add_input(), "pixels", {"batch", std::to_string(t.channels), size, size}, 1);
  std::string logits = emit_model(g, normalized_input(g, t), options, export_options.gelu_form);
  if (compute != onnx::TensorProto::FLOAT)
    logits = g.node("Cast", {logits}, {{"to", int64_t{onnx::TensorProto::FLOAT}}});
  g.node("Identity", {logits}, {}, "logits");
  set_float_value(*graph.add_output(), "logits", {"batch", std::to_string(options.num_classes)}, 1);
  if (const std::vector<std::string> unused = g.unused_weights(); !unused.empty())
    throw std::runtime_error("export: the graph of '" + options.name + "' leaves weight '" + unused.front() +
                             "' (and " + std::to_string(unused.size() - 1) +
                             " more) unused: not the trained model");
  for (const auto& [key, value] : model_card_metadata(card))
    add_metadata(m, key.substr(key.find('.') + 1), value);
  add_metadata(m, "model", options.name);

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out || !m.SerializeToOstream(&out) || !out.flush())
    throw std::runtime_error("cannot write " + path +
                             ". HINT: check that its directory exists and is writable");
  return {graph.node_size(), graph.initializer_size(),
          static_cast<int64_t>(std::filesystem::file_size(path))};
}

}  // namespace trainer
