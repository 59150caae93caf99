#pragma once
// Running the built `trainer` binary from a test, as a user runs it (TRAINER_BIN, set by ctest, or the
// build directory's binary), and reading what it wrote.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace trainer::testing {

struct RunResult {
  int exit_code;
  std::string output;  // stdout and stderr together
};

inline std::string trainer_binary() {
  const char* bin = std::getenv("TRAINER_BIN");
  return bin ? bin : TRAINER_BINARY_DIR "/trainer";
}

// env: "NAME=value ..." for the binary only; shell_prefix: e.g. "ulimit -f 64;".
inline RunResult run_trainer(const std::string& args, const std::string& env = "",
                             const std::string& shell_prefix = "") {
  const std::string cmd =
      "bash -c '" + shell_prefix + " " + env + " " + trainer_binary() + " " + args + "' 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace trainer::testing
