#include "app/commands/predict/predict_command.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "app/commands/predict/image_files.h"
#include "app/commands/predict/image_inputs.h"
#include "app/commands/predict/prediction_output.h"
#include "app/common/cli.h"
#include "app/config/config.h"
#include "app/run/device_setup.h"
#include "app/run/loader_workers.h"
#include "app/run/trained_model.h"
#include "data/loader.h"
#include "data/normalize.h"
#include "nn/amp/autocast.h"
#include "nn/autograd/variable.h"

namespace trainer {
namespace {

const char* kHelp =
    "usage: trainer predict CONFIG --weights PATH [--topk K] [--format table|jsonl|csv]\n"
    "                       [--set section.key=value ...] [--no-verify-crc] PATH...\n\n"
    "Classifies image files (JPEG or PNG, told by their bytes) with trained weights: each file goes\n"
    "through the evaluation transform stored with the weights (resize, centre crop, channels,\n"
    "normalisation), in batches of data.eval_batch_size decoded by data.workers loader threads, on\n"
    "train.device in train.precision, as `trainer eval` does. PATH is a file, a directory (its .jpg,\n"
    ".jpeg and .png files at any depth, sorted) or - (a list of paths on stdin, one a line).\n"
    "A file that cannot be read or decoded is reported (on stderr and in the output) and the others\n"
    "are classified; the exit status is then 1.\n"
    "  --weights PATH      a .safetensors file written by `trainer train` (final.safetensors or a\n"
    "                      checkpoint's model.safetensors); weights without class names (older files,\n"
    "                      torchvision's) are shown by class index and need the config's dataset\n"
    "  --topk K            classes shown per file, most probable first (default 5)\n"
    "  --format table      (default) one line a file: path, then class name and probability\n"
    "  --format jsonl      one JSON object a line: {\"path\", \"top\": [{\"class\", \"index\", "
    "\"probability\"}]}\n"
    "                      or {\"path\", \"error\"}\n"
    "  --format csv        path,rank,index,class,probability,error (one row per file and rank)\n"
    "  --no-verify-crc     skip the weights' CRC-32C check\n";

struct PredictArgs {
  std::string config_path, weights_path, format;
  std::vector<std::string> overrides, paths;
  int64_t topk = 5;
  bool no_verify_crc = false, help = false;
};

PredictArgs parse_predict_args(const std::vector<std::string>& args) {
  PredictArgs a;
  ArgWalker w(args);
  bool config_taken = false;
  while (w.next()) {
    const std::string& arg = w.arg();
    if (arg == "--help" || arg == "-h") {
      a.help = true;
    } else if (arg == "--weights") {
      a.weights_path = w.value();
    } else if (arg == "--format") {
      a.format = w.value();
    } else if (arg == "--set") {
      a.overrides.push_back(set_override(w.value()));
    } else if (arg == "--no-verify-crc") {
      a.no_verify_crc = true;
    } else if (arg == "--topk") {
      const std::string v = w.value();
      char* end = nullptr;
      a.topk = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || a.topk < 1) throw UsageError("--topk expects a positive whole number");
    } else if (arg != "-" && arg.rfind("-", 0) == 0) {
      throw UsageError("unknown option " + arg);
    } else if (!config_taken) {
      a.config_path = arg;
      config_taken = true;
    } else {
      a.paths.push_back(arg);
    }
  }
  if (a.help) return a;
  if (a.config_path.empty()) throw UsageError("missing CONFIG (the TOML file the weights were trained with)");
  if (a.weights_path.empty()) throw UsageError("predict needs --weights PATH");
  if (a.paths.empty())
    throw UsageError("predict needs at least one PATH (a file, a directory, or - for stdin)");
  return a;
}

// The loader over the files: eval's batch size and worker threads, every file once, in order.
LoaderOptions predict_loader_options(const Config& c) {
  LoaderOptions lo;
  lo.batch_size = c.data.eval_batch_size;
  lo.num_workers = c.data.workers < 0 ? default_loader_workers(c, 1) : c.data.workers;
  lo.queue_depth = c.data.prefetch_batches;
  return lo;
}

// The logits of one batch, f32 [B, classes] on the host, in the precision the model trains in.
Tensor batch_logits(TrainedModel& t, const RunDevice& device, const Tensor& images) {
  const EvalTransform& tf = t.card.transform;
  const Tensor x = to_float_normalized(images, tf.mean, tf.std)
                       .to(device.device)
                       .contiguous(device.precision.input_format);
  NoGradGuard no_grad;
  AutocastScope autocast(device.precision.autocast);
  return (*t.model)(Variable(x)).data().to(DType::f32).to(Device::cpu()).contiguous();
}

struct PredictCounts {
  int64_t classified = 0, failed = 0;
};

// Classifies every file, writing each file's result in input order; returns the counts.
PredictCounts classify_files(TrainedModel& t, const RunDevice& device, const Config& config,
                             const std::shared_ptr<ImageFiles>& files, PredictionWriter& writer,
                             int64_t topk) {
  std::vector<int64_t> order(static_cast<size_t>(files->size()));
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  DataLoader loader(files, order, predict_loader_options(config));
  PredictCounts counts;
  int64_t next_file = 0;  // files before it are written
  const auto report_failures_before = [&](int64_t end) {
    for (; next_file < end; ++next_file, ++counts.failed)
      writer.failure(files->path(next_file), files->problem(next_file));
  };
  while (auto batch = loader.next()) {
    const Tensor logits = batch_logits(t, device, batch->images);  // [B, classes]
    const int64_t classes = logits.size(1);
    const float* row = logits.data<float>();
    for (size_t b = 0; b < batch->indices.size(); ++b, row += classes) {
      report_failures_before(batch->indices[b]);
      writer.prediction(files->path(next_file), top_classes(row, classes, topk));
      ++next_file;
      ++counts.classified;
    }
    std::fflush(stdout);
  }
  report_failures_before(files->size());
  return counts;
}

}  // namespace

int predict_command(const std::vector<std::string>& args) {
  const PredictArgs a = parse_predict_args(args);
  if (a.help) {
    std::cout << kHelp;
    return 0;
  }
  const PredictionFormat format = parse_prediction_format(a.format);
  const Config config = load_config(a.config_path, a.overrides);
  const std::vector<std::string> paths = collect_image_paths(a.paths, std::cin);
  // Under a launcher, the GPU of LOCAL_RANK, as `trainer eval` picks it.
  const char* local_rank = std::getenv("LOCAL_RANK");
  const RunDevice device = setup_device(config, local_rank ? std::atoi(local_rank) : 0);
  TrainedModel t =
      load_trained_model(config, a.weights_path, device, a.no_verify_crc ? CrcCheck::skip : CrcCheck::verify);
  std::fprintf(stderr, "%s\n", t.weights_note.c_str());
  if (!t.no_card_reason.empty()) std::fprintf(stderr, "note: %s\n", t.no_card_reason.c_str());

  size_t path_width = 4;
  for (const std::string& p : paths) path_width = std::max(path_width, std::min<size_t>(p.size(), 60));
  PredictionWriter writer(stdout, format, t.card.class_names, path_width);
  writer.header();
  const auto files = std::make_shared<ImageFiles>(paths, t.card.transform);
  const auto start = std::chrono::steady_clock::now();
  const PredictCounts counts = classify_files(t, device, config, files, writer, a.topk);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "predict: %lld images classified, %lld failed, in %.2f s (%.0f img/s) on %s\n",
               static_cast<long long>(counts.classified), static_cast<long long>(counts.failed), seconds,
               static_cast<double>(counts.classified) / std::max(seconds, 1e-9), device.device.str().c_str());
  return counts.failed > 0 ? 1 : 0;
}

}  // namespace trainer
