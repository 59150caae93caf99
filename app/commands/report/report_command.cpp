#include "app/commands/report/report_command.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <stdexcept>

#include "app/commands/report/report_html.h"
#include "app/commands/report/report_run.h"
#include "app/common/cli.h"
#include "metrics/output_file.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

const char* kReportUsage =
    "usage: trainer report RUN_DIR [RUN_DIR ...] [--out FILE.html]\n\n"
    "Writes one self-contained HTML page (inline SVG, no network) with the loss, test accuracy, learning\n"
    "rate and throughput (img/s) curves, the step-phase breakdown over time (shares of data_wait, h2d,\n"
    "forward, backward, exposed all-reduce and optimizer per window of steps) and the summary table of\n"
    "each run directory (train.run_dir of `trainer train`). Several runs overlay on every chart, one\n"
    "colour each. It reads metrics.csv, train_steps.csv, step_times.csv, summary.json, config.toml and\n"
    "train.log, whichever the run has, so a run still training can be reported (run it again to refresh).\n\n"
    "  --out FILE.html  where to write (default: RUN_DIR/report.html for one run, ./report.html for\n"
    "                   several)\n";

}  // namespace

int report_command(const std::vector<std::string>& args) {
  std::vector<std::string> dirs;
  std::string out;
  ArgWalker w(args);
  while (w.next()) {
    const std::string& arg = w.arg();
    if (arg == "--help" || arg == "-h") {
      std::cout << kReportUsage;
      return 0;
    }
    if (arg == "--out") {
      out = w.value();
    } else if (!arg.empty() && arg[0] == '-') {
      throw UsageError("unknown option '" + arg + "'");
    } else {
      dirs.push_back(arg);
    }
  }
  if (dirs.empty()) throw UsageError("missing RUN_DIR (a run directory written by `trainer train`)");
  std::vector<ReportRun> runs;
  for (const std::string& d : dirs) runs.push_back(read_report_run(d));
  // Legends name runs by directory; two runs/.../x directories are told apart by their parents too.
  std::vector<std::string> names;
  for (const ReportRun& r : runs) names.push_back(r.name);
  for (ReportRun& r : runs)
    if (std::count(names.begin(), names.end(), r.name) > 1) {
      fs::path p = fs::absolute(r.dir).lexically_normal();
      if (!p.has_filename()) p = p.parent_path();  // "runs/x/"
      r.name = p.parent_path().filename().string() + "/" + r.name;
    }
  const fs::path path = !out.empty()       ? fs::path(out)
                        : dirs.size() == 1 ? fs::path(dirs[0]) / "report.html"
                                           : fs::path("report.html");
  const std::string html = report_html(runs);
  write_whole_file(path.string(), html);  // its error names the file, the cause and a HINT
  std::printf("wrote %s (%zu run%s)\n", path.c_str(), runs.size(), runs.size() == 1 ? "" : "s");
  return 0;
}

}  // namespace trainer
