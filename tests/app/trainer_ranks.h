#pragma once
// Ranks of the trainer binary started by hand with torchrun's variables on loopback, each a
// ChildProcess (so a test can watch them while they run, and none outlives the test), with its output
// in DIR/rankN.out.
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "app/trainer_process.h"
#include "metrics/child_process.h"
#include "metrics/http_client.h"

namespace trainer::testing {

class TrainerRanks {
 public:
  // Starts `world` ranks of `trainer <args...>`; all ranks on this host (LOCAL_RANK = RANK).
  TrainerRanks(int world, const std::vector<std::string>& args, const std::filesystem::path& dir)
      : dir_(dir) {
    const std::string master_port = std::to_string(free_port());
    for (int r = 0; r < world; ++r) {
      std::vector<std::string> argv = {trainer_binary()};
      argv.insert(argv.end(), args.begin(), args.end());
      const std::vector<std::string> env = {"RANK=" + std::to_string(r),
                                            "LOCAL_RANK=" + std::to_string(r),
                                            "WORLD_SIZE=" + std::to_string(world),
                                            "LOCAL_WORLD_SIZE=" + std::to_string(world),
                                            "MASTER_ADDR=127.0.0.1",
                                            "MASTER_PORT=" + master_port};
      ranks_.push_back(std::make_unique<ChildProcess>(argv, log_path(r).string(), env));
    }
  }

  int size() const { return static_cast<int>(ranks_.size()); }
  ChildProcess& rank(int r) { return *ranks_.at(r); }
  std::filesystem::path log_path(int r) const { return dir_ / ("rank" + std::to_string(r) + ".out"); }
  std::string output(int r) const { return read_file(log_path(r)); }
  std::string outputs() const {
    std::string s;
    for (int r = 0; r < size(); ++r) s += "--- rank " + std::to_string(r) + ":\n" + output(r);
    return s;
  }
  // Exit codes once every rank has ended, or nullopt for those still running at the deadline.
  std::vector<std::optional<int>> wait_until(ChildProcess::Clock::time_point deadline) {
    std::vector<std::optional<int>> codes;
    for (auto& p : ranks_) codes.push_back(p->wait_until(deadline));
    return codes;
  }

 private:
  std::filesystem::path dir_;
  std::vector<std::unique_ptr<ChildProcess>> ranks_;
};

}  // namespace trainer::testing
