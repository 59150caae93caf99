#include "app/commands/export/export_command.h"

#include <cstdio>
#include <iostream>
#include <set>

#include "app/commands/export/onnx_writer.h"
#include "app/common/cli.h"
#include "app/common/format.h"
#include "app/config/config.h"
#include "app/run/device_setup.h"
#include "app/run/trained_model.h"
#include "nn/format_bytes.h"
#include "nn/modules/basic.h"

namespace trainer {
namespace {

const char* kHelp =
    "usage: trainer export CONFIG --weights PATH --out FILE.onnx [--fp16] [--set section.key=value ...]\n"
    "                      [--no-verify-crc]\n\n"
    "Writes the model CONFIG describes, with the trained weights, as an ONNX graph (opset 17) that ONNX\n"
    "Runtime and other deployment runtimes read:\n"
    "  input  \"pixels\": float32 [N, C, H, W], the image after the evaluation Resize + CenterCrop\n"
    "         (stored with the weights: `trainer predict` uses the same), scaled to [0, 1] like\n"
    "         torchvision's ToTensor; the normalisation (mean, std) is the graph's first two nodes\n"
    "  output \"logits\": float32 [N, classes]; N is any batch size\n"
    "The class names and the transform are in the model's metadata_props (class_names,\n"
    "eval_transform: JSON).\n"
    "  --fp16  weights and arithmetic in float16 (half the file); input and output stay float32\n";

struct ExportArgs {
  std::string config_path, weights_path, out_path;
  std::vector<std::string> overrides;
  bool fp16 = false, no_verify_crc = false, help = false;
};

ExportArgs parse_export_args(const std::vector<std::string>& args) {
  ExportArgs a;
  ArgWalker w(args);
  while (w.next()) {
    const std::string& arg = w.arg();
    if (arg == "--help" || arg == "-h")
      a.help = true;
    else if (arg == "--weights")
      a.weights_path = w.value();
    else if (arg == "--out")
      a.out_path = w.value();
    else if (arg == "--fp16")
      a.fp16 = true;
    else if (arg == "--no-verify-crc")
      a.no_verify_crc = true;
    else if (arg == "--set")
      a.overrides.push_back(set_override(w.value()));
    else
      w.config_or_unknown(a.config_path);
  }
  if (a.help) return a;
  if (a.config_path.empty()) throw UsageError("missing CONFIG (the TOML file the weights were trained with)");
  if (a.weights_path.empty()) throw UsageError("export needs --weights PATH");
  if (a.out_path.empty()) throw UsageError("export needs --out FILE.onnx");
  return a;
}

// The GELU form the model computes (every GELU of the shipped models has the same one).
F::GeluApproximation gelu_form(Module& model) {
  std::set<F::GeluApproximation> forms;
  for (const auto& [name, m] : model.named_modules())
    if (const auto* gelu = dynamic_cast<const GELU*>(m)) forms.insert(gelu->approximate());
  if (forms.size() > 1) throw std::runtime_error("export: the model mixes GELU forms (erf and tanh)");
  return forms.empty() ? F::GeluApproximation::none : *forms.begin();
}

}  // namespace

int export_command(const std::vector<std::string>& args) {
  const ExportArgs a = parse_export_args(args);
  if (a.help) {
    std::cout << kHelp;
    return 0;
  }
  const Config config = load_config(a.config_path, a.overrides);
  // The graph is built from host copies of the weights: the CPU whatever train.device says.
  TrainedModel t = load_trained_model(config, a.weights_path, cpu_run_device(config),
                                      a.no_verify_crc ? CrcCheck::skip : CrcCheck::verify);
  std::fprintf(stderr, "%s\n", t.weights_note.c_str());
  if (!t.no_card_reason.empty())
    std::fprintf(stderr, "note: %s; the transform comes from the config's dataset\n",
                 t.no_card_reason.c_str());
  OnnxExportOptions options;
  options.fp16 = a.fp16;
  options.gelu_form = gelu_form(*t.model);
  const OnnxExportReport r = write_onnx(a.out_path, *t.model, t.options, t.card, options);
  std::printf(
      "export: %s (%s, %s): %lld nodes, %lld initializers, %s; input pixels [N, %lld, %lld, %lld] in [0, "
      "1]\n",
      a.out_path.c_str(), t.options.name.c_str(), a.fp16 ? "float16" : "float32",
      static_cast<long long>(r.nodes), static_cast<long long>(r.initializers),
      format_bytes(static_cast<double>(r.bytes)).c_str(), static_cast<long long>(t.card.transform.channels),
      static_cast<long long>(t.card.transform.crop), static_cast<long long>(t.card.transform.crop));
  return 0;
}

}  // namespace trainer
