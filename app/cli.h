#pragma once
// Parsing of the options the subcommands share: CONFIG, --set key=value (repeatable), --summary,
// --weights, --resume, --dump-logits, --help.
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace trainer {

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct CommonArgs {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string summary_path;
  std::string weights_path;
  std::string resume;
  std::string dump_logits_path;
  bool help = false;
};

// `allowed` lists the flags this subcommand accepts besides --set and --help ("--summary", ...).
CommonArgs parse_common_args(const std::vector<std::string>& args, const std::vector<std::string>& allowed);

}  // namespace trainer
