#include "app/commands.h"

#include <cstdlib>
#include <iostream>

#include "app/cli.h"
#include "app/config.h"
#include "app/device_setup.h"
#include "app/evaluate.h"
#include "app/experiment.h"
#include "app/summary.h"
#include "app/train_loop.h"
#include "nn/safetensors.h"

namespace trainer {

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
  const CommonArgs a = parse_common_args(args, {"--summary", "--weights", "--dump-logits"});
  if (a.help) {
    std::cout
        << "usage: trainer eval CONFIG --weights PATH [--set section.key=value ...] [--summary PATH]\n"
           "                    [--dump-logits PATH]\n\n"
           "Evaluates weights (a .safetensors file written by `trainer train`, or a torchvision\n"
           "state_dict saved with safetensors) on the test split of the config's dataset.\n"
           "  --dump-logits PATH  also write the first 256 test images (normalized, NCHW), their labels\n"
           "                      and the model's logits to PATH (safetensors), for comparing with\n"
           "                      PyTorch (scripts/torchvision_logits_check.py)\n";
    return 0;
  }
  if (a.weights_path.empty()) throw UsageError("eval needs --weights PATH");
  const Config config = load_config(a.config_path, a.overrides);
  const char* local_rank = std::getenv("LOCAL_RANK");
  const Device device = setup_device(config, local_rank ? std::atoi(local_rank) : 0);
  Experiment e = build_experiment(config, device, false);
  load_module(a.weights_path, *e.model);
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
    RunSummary s;
    s.final_test_accuracy = s.best_test_accuracy = m.top1();
    s.final_test_top5 = m.top5();
    s.final_test_loss = m.mean_loss();
    s.final_test_skipped = skipped;
    s.weights = a.weights_path;
    write_summary(a.summary_path, s);
  }
  return 0;
}

int config_command(const Args& args) {
  const CommonArgs a = parse_common_args(args, {});
  if (a.help) {
    std::cout << "usage: trainer config CONFIG [--set section.key=value ...]\n\n"
                 "Validates CONFIG and prints every key with its resolved value and where it came from.\n";
    return 0;
  }
  const Config config = load_config(a.config_path, a.overrides);
  std::cout << config_table(config);
  return 0;
}

}  // namespace trainer
