#pragma once
// `trainer export CONFIG --weights W --out model.onnx [--fp16]`: trained weights as an ONNX graph
// (app/commands/export/onnx_graph.h says what the graph is). Built only where Debian's libonnx-dev and
// libprotobuf-dev were found; without them the command says so (export_unavailable.cpp).
#include <string>
#include <vector>

namespace trainer {

// The exit status of `trainer export` in a build without ONNX (tests skip on it).
inline constexpr int kExportNotBuiltIn = 3;

int export_command(const std::vector<std::string>& args);

}  // namespace trainer
