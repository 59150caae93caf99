#include "app/common/cli.h"

#include <algorithm>

namespace trainer {

std::string set_override(const std::string& value) {
  const size_t eq = value.find('=');
  if (eq == std::string::npos || eq == 0)
    throw UsageError("--set expects section.key=value (e.g. --set optim.lr=0.05), got '" + value + "'");
  return value;
}

CommonArgs parse_common_args(const std::vector<std::string>& args, const std::vector<std::string>& allowed) {
  CommonArgs out;
  auto is_allowed = [&](const std::string& flag) {
    return std::find(allowed.begin(), allowed.end(), flag) != allowed.end();
  };
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    std::string value;
    bool has_inline_value = false;
    // --flag=value form; the split is at the first '=', so --set=a.b=c keeps "a.b=c" whole.
    if (const size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_inline_value = true;
    }
    auto take_value = [&]() -> std::string {
      if (has_inline_value) return value;
      if (i + 1 >= args.size()) throw UsageError(arg + " needs a value");
      return args[++i];
    };
    if (arg == "--help" || arg == "-h") {
      out.help = true;
    } else if (arg == "--set") {
      out.overrides.push_back(set_override(take_value()));
    } else if (arg == "--summary" && is_allowed(arg)) {
      out.summary_path = take_value();
    } else if (arg == "--resume" && is_allowed(arg)) {
      out.resume = take_value();
    } else if (arg == "--weights" && is_allowed(arg)) {
      out.weights_path = take_value();
    } else if (arg == "--dump-logits" && is_allowed(arg)) {
      out.dump_logits_path = take_value();
    } else if (arg == "--format" && is_allowed(arg)) {
      out.format = take_value();
    } else if (arg == "--no-verify-crc" && is_allowed(arg) && !has_inline_value) {
      out.no_verify_crc = true;
    } else if (arg.rfind("-", 0) == 0) {
      throw UsageError("unknown option " + arg);
    } else if (out.config_path.empty()) {
      out.config_path = arg;
    } else {
      throw UsageError("unexpected argument '" + arg + "' (the config is already " + out.config_path + ")");
    }
  }
  if (!out.help && out.config_path.empty())
    throw UsageError("missing CONFIG (a TOML file, e.g. configs/fashion_mnist_cnn.toml)");
  return out;
}

bool ArgWalker::next() {
  if (next_ >= args_.size()) return false;
  arg_ = args_[next_++];
  has_inline_value_ = false;
  if (const size_t eq = arg_.find('='); arg_.rfind("--", 0) == 0 && eq != std::string::npos) {
    inline_value_ = arg_.substr(eq + 1);
    arg_.resize(eq);
    has_inline_value_ = true;
  }
  return true;
}

std::string ArgWalker::value() {
  if (has_inline_value_) return inline_value_;
  if (next_ >= args_.size()) throw UsageError(arg_ + " needs a value");
  return args_[next_++];
}

void ArgWalker::config_or_unknown(std::string& config_path) const {
  if (arg_.rfind("-", 0) == 0) throw UsageError("unknown option " + arg_);
  if (!config_path.empty())
    throw UsageError("unexpected argument '" + arg_ + "' (the config is already " + config_path + ")");
  config_path = arg_;
}

}  // namespace trainer
