#pragma once
// A trained model as an ONNX file (opset 17, IR version 8, what ONNX 1.12 and ONNX Runtime read):
//   input  "pixels"  float32 [N, C, H, W]: the image after Resize + CenterCrop (the model card's
//                    eval_transform), RGB or grey, scaled to [0, 1] as torchvision's ToTensor makes it;
//   first nodes      Sub(mean) and Div(std): the normalisation is folded into the graph;
//   output "logits"  float32 [N, classes]; softmax gives the probabilities.
// N is symbolic ("batch"): any batch size runs. With fp16 the weights and the computation are float16
// between a Cast after the normalisation and a Cast back before the output, so the interface stays
// float32. The model's metadata_props carry the class names and the transform (JSON), as the weights'
// safetensors metadata does (app/run/model_card.h).
#include <string>

#include "app/run/model_card.h"
#include "nn/functional.h"
#include "nn/models/registry.h"
#include "nn/modules/module.h"

namespace trainer {

struct OnnxExportOptions {
  bool fp16 = false;
  F::GeluApproximation gelu_form = F::GeluApproximation::none;
};

struct OnnxExportReport {
  int64_t nodes = 0, initializers = 0, bytes = 0;
};

// Throws std::runtime_error when the model cannot be expressed (an unknown family, weights the graph
// does not use) or the file cannot be written.
OnnxExportReport write_onnx(const std::string& path, Module& model, const ModelOptions& options,
                            const ModelCard& card, const OnnxExportOptions& export_options);

}  // namespace trainer
