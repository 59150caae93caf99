// trainer: trains image classifiers from a TOML file. Dispatches to one subcommand per file.
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "app/commands/bench/bench_command.h"
#include "app/commands/bench/bench_data_command.h"
#include "app/commands/doctor/doctor_command.h"
#include "app/commands/export/export_command.h"
#include "app/commands/launch/launch_command.h"
#include "app/commands/plan/plan_command.h"
#include "app/commands/predict/predict_command.h"
#include "app/commands/report/report_command.h"
#include "app/commands/train_eval/commands.h"
#include "app/common/build_info.h"
#include "app/common/cli.h"
#include "app/common/file_errors.h"
#include "app/config/config.h"
#include "app/train/train_signals.h"
#include "dist/error.h"
#include "dist/heartbeat.h"
#include "dist/store.h"
#include "metrics/log.h"
#include "nn/cpu/blas_kernels.h"

namespace {

// The message that ends a command goes to stderr and, once a run has opened its log file (train.log,
// train.rank<N>.log), into that file too: the log of a failed run must say why it ended.
void report(const std::string& text) { trainer::Log::instance().error(text); }

const char* kUsage =
    "usage: trainer <command> [options]\n\n"
    "commands:\n"
    "  train CONFIG [--set k=v ...] [--summary PATH]    train a model\n"
    "  eval CONFIG --weights PATH [--summary PATH]      evaluate saved weights on the test split\n"
    "  predict CONFIG --weights PATH PATH...            classify image files (top-k classes)\n"
    "  export CONFIG --weights PATH --out FILE.onnx     write the model as an ONNX graph\n"
    "  config CONFIG [--set k=v ...] [--format toml]    print the resolved configuration\n"
    "  launch --nproc-per-node N -- COMMAND [...]       run COMMAND as N local ranks, like torchrun\n"
    "  bench CONFIG --procs 1,2,4 [...]                 measure throughput and speedup over processes\n"
    "  bench-data [--out DIR] [...]                     measure the data loader alone: JPEG and CIFAR\n"
    "  plan CONFIG --procs N [--device-memory GiB]      memory per rank under DP and ZeRO-1/2/3\n"
    "  doctor [CONFIG]                                  pre-flight checks of this machine (and CONFIG)\n"
    "  report RUN_DIR [RUN_DIR ...] [--out FILE.html]   charts of runs as one HTML page\n"
    "  version                                          print the build\n\n"
    "`trainer <command> --help` describes a command. configs/reference.toml lists every config key.\n";

}  // namespace

int main(int argc, char** argv) {
  using namespace trainer;
  select_fast_blas_kernels(argv);
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  const std::string command = args[0];
  args.erase(args.begin());
  try {
    if (command == "train") return train_command(args);
    if (command == "eval") return eval_command(args);
    if (command == "predict") return predict_command(args);
    if (command == "export") return export_command(args);
    if (command == "config") return config_command(args);
    if (command == "launch") return launch_command(args);
    if (command == "bench") return bench_command(args);
    if (command == "bench-data") return bench_data_command(args);
    if (command == "plan") return plan_command(args);
    if (command == "doctor") return doctor_command(args);
    if (command == "report") return report_command(args);
    if (command == "version" || command == "--version") {
      const TrainerBuild b = trainer_build();
      std::printf("%s\n", b.str().c_str());
      return 0;
    }
    std::fprintf(stderr, "trainer: unknown command '%s'\n\n%s", command.c_str(), kUsage);
    return 2;
  } catch (const UsageError& e) {
    report("trainer " + command + ": " + e.what() + "\nSee `trainer " + command + " --help`.");
    return 2;
  } catch (const ConfigError& e) {
    report(std::string("trainer: config error: ") + e.what());
    return 1;
  } catch (const WaitInterrupted& e) {
    // A stop signal while this rank waited for the others (start-up): nothing failed, exit as asked.
    const std::string origin = stop_signal_origin();
    report(std::string("trainer: ") + e.what() + (origin.empty() ? "" : " (" + origin + ")"));
    return 128 + e.signal();
  } catch (const DistError& e) {
    // At start-up, a rank that was sent a stop signal and then learnt that another rank stopped (or
    // left) exits as its signal asks: it was stopped, it did not fail.
    if (const int signal = pending_stop_signal()) {
      report("trainer: stopped by signal " + std::to_string(signal) + " at start-up: " + e.what());
      return 128 + signal;
    }
    // A collective failed: say what every rank was doing (dead, stuck elsewhere, behind).
    std::string context = failure_context();
    if (!context.empty()) context = "\n" + context;
    report(std::string("trainer: error: ") + e.what() + context);
    return 1;
  } catch (const std::filesystem::filesystem_error& e) {
    report(std::string("trainer: error: ") + describe_filesystem_error(e));
    return 1;
  } catch (const std::exception& e) {
    report(std::string("trainer: error: ") + e.what());
    return 1;
  }
}
