#pragma once
// Parsing of the options the subcommands share: CONFIG, --set key=value (repeatable), --summary,
// --weights, --resume, --dump-logits, --format, --help.
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
  std::string format;          // `trainer config --format`
  bool no_verify_crc = false;  // eval: load --weights without checking their CRC-32C
  bool help = false;
};

// The value of a --set flag, checked to be "section.key=value"; a UsageError (exit 2) otherwise.
std::string set_override(const std::string& value);

// `allowed` lists the flags this subcommand accepts besides --set and --help ("--summary", ...).
CommonArgs parse_common_args(const std::vector<std::string>& args, const std::vector<std::string>& allowed);

// Walks a subcommand's own arguments, "--flag value" and "--flag=value" alike:
//   ArgWalker w(args);
//   while (w.next()) { if (w.arg() == "--procs") ... = w.value(); else w.config_or_unknown(a.config_path); }
class ArgWalker {
 public:
  explicit ArgWalker(const std::vector<std::string>& args) : args_(args) {}
  bool next();                                     // moves to the next argument; false after the last
  const std::string& arg() const { return arg_; }  // the flag (without "=value"), or a positional one
  std::string value();                             // the flag's value; UsageError when it has none
  // For an argument the subcommand does not handle: the CONFIG path when it is the first positional
  // one, else a UsageError (unknown option, or a second positional argument).
  void config_or_unknown(std::string& config_path) const;

 private:
  const std::vector<std::string>& args_;
  size_t next_ = 0;
  std::string arg_, inline_value_;
  bool has_inline_value_ = false;
};

}  // namespace trainer
