#pragma once
// Running the built `trainer` binary from a test, as a user runs it (see trainer_binary()), and
// reading what it wrote.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

namespace trainer::testing {

struct RunResult {
  int exit_code;
  std::string output;  // stdout and stderr together
};

// TRAINER_BIN, else a `trainer` beside the test binary (a bundle copied to a GPU host keeps them
// together), else the build directory's.
inline std::string trainer_binary() {
  if (const char* bin = std::getenv("TRAINER_BIN")) return bin;
  std::error_code ec;
  const std::filesystem::path beside =
      std::filesystem::read_symlink("/proc/self/exe", ec).parent_path() / "trainer";
  if (!ec && std::filesystem::is_regular_file(beside, ec)) return beside.string();
  return TRAINER_BINARY_DIR "/trainer";
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

// A fixture with a fresh directory per test (removed afterwards) and a small synthetic training config:
// cnn on 256 12x12 images, batch 32 (8 steps per epoch), 2 epochs; `extra` is appended as TOML.
class TrainerRunTest : public ::testing::Test {
 protected:
  explicit TrainerRunTest(std::string prefix) : prefix_(std::move(prefix)) {}
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           (prefix_ + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string write_small_config(const std::string& extra) {
    const std::filesystem::path path = dir_ / "small.toml";
    std::ofstream(path)
        << "[model]\nname = \"cnn\"\nin_channels = 1\n"
           "[data]\ndataset = \"synthetic\"\nsynthetic_samples = 256\nsynthetic_image_size = 12\n"
           "batch_size = 32\nrandom_crop_padding = 2\nhflip = true\n"
        << extra;
    return path.string();
  }
  std::string run_dir(const std::string& name) { return (dir_ / name).string(); }

  std::filesystem::path dir_;

 private:
  std::string prefix_;
};

// Saves an environment variable for a scope (setting it, when a value is given) and puts back what was
// there afterwards.
class ScopedEnv {
 public:
  explicit ScopedEnv(const char* name) : name_(name) {
    if (const char* v = std::getenv(name)) old_ = v;
  }
  ScopedEnv(const char* name, const std::string& value) : ScopedEnv(name) {
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Column name -> values, of a CSV the trainer wrote (a header line, numeric fields): step_times.csv.
inline std::map<std::string, std::vector<double>> read_csv_columns(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string line;
  std::vector<std::string> names;
  std::map<std::string, std::vector<double>> columns;
  if (std::getline(in, line)) {
    std::stringstream header(line);
    for (std::string name; std::getline(header, name, ',');) names.push_back(name);
  }
  while (std::getline(in, line)) {
    std::stringstream row(line);
    std::string field;
    for (std::size_t i = 0; i < names.size() && std::getline(row, field, ','); ++i)
      columns[names[i]].push_back(std::stod(field));
  }
  return columns;
}

// Runs one `trainer` process per entry of rank_args (rank = index) as torchrun would start them
// (RANK, WORLD_SIZE, LOCAL_RANK = rank, LOCAL_WORLD_SIZE, MASTER_ADDR 127.0.0.1, MASTER_PORT port), rank
// r writing to dir/rank<r>.out, and waits for all of them. prefix[r] is put before rank r's command:
// variables that override these (LOCAL_RANK=0) or a wrapper (timeout -s KILL 2).
inline std::vector<RunResult> run_ranks(const std::filesystem::path& dir, int port,
                                        const std::vector<std::string>& rank_args,
                                        const std::vector<std::string>& prefix = {}) {
  const int n = static_cast<int>(rank_args.size());
  std::string script;
  for (int r = 0; r < n; ++r) {
    const std::string out = (dir / ("rank" + std::to_string(r) + ".out")).string();
    script += "(RANK=" + std::to_string(r) + " WORLD_SIZE=" + std::to_string(n) +
              " LOCAL_RANK=" + std::to_string(r) + " LOCAL_WORLD_SIZE=" + std::to_string(n) +
              " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) + " " +
              (r < static_cast<int>(prefix.size()) ? prefix[r] : "") + " " + trainer_binary() + " " +
              rank_args[r] + " > " + out + " 2>&1; echo $? > " + out + ".rc) & ";
  }
  script += "wait";
  const int rc = std::system(("bash -c '" + script + "'").c_str());
  (void)rc;  // each rank's own status is in its .rc file
  std::vector<RunResult> results;
  for (int r = 0; r < n; ++r) {
    const std::filesystem::path out = dir / ("rank" + std::to_string(r) + ".out");
    std::ifstream status(out.string() + ".rc");
    int code = -1;
    status >> code;
    results.push_back({code, read_file(out)});
  }
  return results;
}

// A TCP port another "job" holds for the object's lifetime (listening on every interface), for the
// tests of the trainer's messages about taken ports. port is 0 if the socket could not be set up.
class TakenPort {
 public:
  TakenPort() : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof addr;
    if (fd_ >= 0 && ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
        ::listen(fd_, 1) == 0 && ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
      port_ = ntohs(addr.sin_port);
  }
  ~TakenPort() { release(); }
  TakenPort(const TakenPort&) = delete;
  TakenPort& operator=(const TakenPort&) = delete;
  int port() const { return port_; }
  void release() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace trainer::testing
