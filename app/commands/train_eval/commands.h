#pragma once
// The subcommands of the `trainer` binary. Each takes the arguments after its name and returns the
// process exit code (0 success, 1 a run error, 2 a usage error).
#include <string>
#include <vector>

namespace trainer {

using Args = std::vector<std::string>;

int train_command(const Args& args);
int eval_command(const Args& args);
int config_command(const Args& args);

}  // namespace trainer
