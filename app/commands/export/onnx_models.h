#pragma once
// Each shipped model family (nn/models/registry.h) as ONNX nodes: mlp, cnn, resnet18/34/50 (both
// stems), vit / vit_s_16 / vit_b_16 and convnext / convnext_tiny. The structure comes from the model's
// options and its state-dict names (torchvision's), the arithmetic from the module emitters
// (app/commands/export/onnx_layers.h). Takes the normalised images [N, C, H, W] and returns the
// logits [N, classes].
#include <string>

#include "app/commands/export/onnx_graph.h"
#include "nn/functional.h"
#include "nn/models/registry.h"

namespace trainer {

// Throws std::runtime_error for a model name no emitter knows.
std::string emit_model(OnnxGraph& g, const std::string& images, const ModelOptions& options,
                       F::GeluApproximation gelu_form);

}  // namespace trainer
