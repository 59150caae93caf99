#include "app/commands/train_eval/commands.h"

#include <cstdlib>
#include <iostream>

#include "app/commands/train_eval/eval_summary.h"
#include "app/common/cli.h"
#include "app/config/config.h"
#include "app/run/checkpoint.h"
#include "app/run/device_setup.h"
#include "app/run/evaluate.h"
#include "app/run/experiment.h"
#include "app/train/train_loop.h"
#include "nn/safetensors.h"

namespace trainer {
namespace {

// A launcher's variable (LOCAL_RANK, LOCAL_WORLD_SIZE), read at the eval command's start; `fallback`
// when unset. `trainer train` reads them through ProcessEnv instead.
int launcher_variable(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value ? std::atoi(value) : fallback;
}

}  // namespace

int train_command(const Args& args) {
  const CommonArgs a = parse_common_args(args, {"--summary", "--resume"});
  if (a.help) {
    std::cout
        << "usage: trainer train CONFIG [--set section.key=value ...] [--summary PATH] [--resume "
           "auto|PATH]\n\n"
           "Trains the model CONFIG describes. Writes the resolved config, the log (train.log), per-step\n"
           "losses (train_steps.csv), summary.json and the final weights (checkpoints/final.safetensors)\n"
           "into train.run_dir (default runs/<config name>-<time>).\n"
           "  --set section.key=value  override a config key (repeatable), typed like the TOML file\n"
           "  --summary PATH           also write the run summary JSON to PATH\n"
           "  --resume auto|PATH       continue from a checkpoint directory; auto = the newest one that\n"
           "                           verifies in the checkpoint dir (broken ones are skipped)\n";
    return 0;
  }
  const Config config = load_config(a.config_path, a.overrides);
  return run_training(config, TrainOptions{a.summary_path, a.resume});
}

int eval_command(const Args& args) {
  const CommonArgs a =
      parse_common_args(args, {"--summary", "--weights", "--dump-logits", "--no-verify-crc"});
  if (a.help) {
    std::cout
        << "usage: trainer eval CONFIG --weights PATH [--set section.key=value ...] [--summary PATH]\n"
           "                    [--dump-logits PATH] [--no-verify-crc]\n\n"
           "Evaluates weights (a .safetensors file written by `trainer train`, or a torchvision\n"
           "state_dict saved with safetensors) on the test split of the config's dataset. Files the\n"
           "trainer wrote carry a CRC-32C per tensor, checked before evaluating: a corrupt tensor stops\n"
           "the evaluation, naming it. A file without CRC-32Cs (foreign) is evaluated unverified.\n"
           "  --no-verify-crc     skip the CRC-32C check (evaluate a damaged file as it is)\n"
           "  --summary PATH      also write the figures printed (loss, top1, top5, auc, images counted,\n"
           "                      per-class accuracy) and the weights file as JSON to PATH\n"
           "  --dump-logits PATH  also write the first 256 test images (normalized, NCHW), their labels\n"
           "                      and the model's logits to PATH (safetensors), for comparing with\n"
           "                      PyTorch (scripts/torchvision_logits_check.py)\n";
    return 0;
  }
  if (a.weights_path.empty()) throw UsageError("eval needs --weights PATH");
  const Config config = load_config(a.config_path, a.overrides);
  const RunDevice device = setup_device(config, launcher_variable("LOCAL_RANK", 0));
  Experiment e = build_experiment(config, device, false, 1, 0, launcher_variable("LOCAL_WORLD_SIZE", 1));
  std::printf(
      "%s\n",
      load_weights(a.weights_path, *e.model, a.no_verify_crc ? CrcCheck::skip : CrcCheck::verify).c_str());
  int64_t skipped = 0;
  EvalMetrics m = evaluate(e, *e.data.test, nullptr, &skipped);
  if (!a.dump_logits_path.empty()) dump_logits(e, *e.data.test, 256, a.dump_logits_path);
  const std::string skipped_note =
      skipped > 0 ? " (" + std::to_string(skipped) + " unreadable skipped, data.bad_samples = \"skip\")" : "";
  std::printf("eval %s on %s: %lld images%s, loss %.4f, top1 %.2f%%, top5 %.2f%%, auc %.4f\n",
              a.weights_path.c_str(), e.data.test->name().c_str(), static_cast<long long>(m.count()),
              skipped_note.c_str(), m.mean_loss(), 100 * m.top1(), 100 * m.top5(), m.auc());
  const std::vector<double> per_class = m.per_class_accuracy();
  const auto& names = e.data.test->class_names();
  for (size_t c = 0; c < per_class.size(); ++c)
    std::printf("  %-14s %.2f%%\n", c < names.size() ? names[c].c_str() : std::to_string(c).c_str(),
                100 * per_class[c]);
  if (!a.summary_path.empty()) {
    EvalSummary s{.weights = a.weights_path,
                  .dataset = e.data.test->name(),
                  .images = m.count(),
                  .skipped_images = skipped,
                  .loss = m.mean_loss(),
                  .top1 = m.top1(),
                  .top5 = m.top5(),
                  .auc = m.auc(),
                  .class_names = names,
                  .per_class_accuracy = per_class};
    write_eval_summary(a.summary_path, s);
  }
  return 0;
}

int config_command(const Args& args) {
  const CommonArgs a = parse_common_args(args, {"--format"});
  if (a.help) {
    std::cout
        << "usage: trainer config CONFIG [--set section.key=value ...] [--format table|toml]\n\n"
           "Validates CONFIG and prints every key with its resolved value:\n"
           "  --format table  (default) one line per key with where its value came from\n"
           "  --format toml   a TOML config that `trainer train` takes and that resolves to the same\n"
           "                  values; special values (workers = -1, num_classes = 0) say what they mean\n";
    return 0;
  }
  const std::string format = a.format.empty() ? "table" : a.format;
  if (format != "table" && format != "toml")
    throw UsageError("--format expects table or toml, got '" + format + "'");
  const Config config = load_config(a.config_path, a.overrides);
  std::cout << (format == "toml" ? config_to_editable_toml(config) : config_table(config));
  return 0;
}

}  // namespace trainer
