// `trainer launch`: argument parsing, the ranks' environment and line prefixing as functions; then the
// built binary run as a user would run it (loopback only, a few seconds in all).
#include "app/commands/launch/launch_command.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "app/common/cli.h"
#include "app/launcher_process.h"
#include "app/trainer_process.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;
using trainer::testing::expect_gone;
using trainer::testing::free_ephemeral_port;
using trainer::testing::Launcher;

// ---- functions ----

TEST(LaunchArgs, ParsesBothOptionFormsAndTheCommand) {
  const LaunchArgs a =
      parse_launch_args({"--nproc-per-node=4", "--nnodes", "2", "--node-rank=1", "--master-addr", "node0",
                         "--master-port=1234", "--", "train", "c.toml", "--set", "x=1"});
  EXPECT_EQ(a.nproc_per_node, 4);
  EXPECT_EQ(a.nnodes, 2);
  EXPECT_EQ(a.node_rank, 1);
  EXPECT_EQ(a.master_addr, "node0");
  EXPECT_EQ(a.master_port, 1234);
  EXPECT_EQ(a.command, (std::vector<std::string>{"train", "c.toml", "--set", "x=1"}));
  const LaunchArgs d = parse_launch_args({"--nproc-per-node", "2", "--", "train", "--help"});
  EXPECT_EQ(d.master_addr, "127.0.0.1");
  EXPECT_EQ(d.master_port, 29500);
  EXPECT_EQ(d.nnodes, 1);
  EXPECT_FALSE(d.help);  // --help after `--` belongs to the command
  EXPECT_TRUE(parse_launch_args({"--help"}).help);
}

void expect_usage_error(const std::vector<std::string>& args, const std::string& says) {
  try {
    parse_launch_args(args);
    ADD_FAILURE() << "no UsageError; expected one saying: " << says;
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
}

TEST(LaunchArgs, RejectsBadArgumentsWithUsageErrors) {
  expect_usage_error({"--nproc-per-node", "2", "train", "c.toml"}, "missing `--`");
  expect_usage_error({"--nproc-per-node", "2"}, "missing `--`");
  expect_usage_error({"--nproc-per-node", "2", "--"}, "nothing to run");
  expect_usage_error({"--", "version"}, "--nproc-per-node N is required");
  expect_usage_error({"--nproc-per-node", "0", "--", "version"}, "between 1 and");
  expect_usage_error({"--nproc-per-node=two", "--", "version"}, "expects a whole number, got 'two'");
  expect_usage_error({"--nproc-per-node", "--", "version"}, "--nproc-per-node needs a value");
  expect_usage_error(
      {"--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "2", "--master-addr", "h", "--", "x"},
      "--node-rank must be between 0 and 1");
  expect_usage_error({"--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1", "--", "version"},
                     "needs --master-addr");
  expect_usage_error({"--nproc-per-node", "2", "--master-port", "70000", "--", "version"}, "--master-port");
  expect_usage_error({"--nproc-per-node", "2", "--bogus", "--", "version"}, "unknown option --bogus");
  expect_usage_error({"--nproc-per-node", "2", "--", "launch", "--nproc-per-node", "2", "--", "version"},
                     "cannot be launch");
}

TEST(LaunchEnvironment, SetsTheTorchrunVariablesAndDropsTorchelastic) {
  const LaunchArgs a = parse_launch_args(
      {"--nproc-per-node", "4", "--nnodes", "3", "--node-rank", "2", "--master-addr", "n0", "--", "version"});
  const auto env =
      launch_child_environment({{"TORCHELASTIC_RUN_ID", "x"}, {"RANK", "9"}, {"PATH", "/bin"}}, a, 3);
  EXPECT_EQ(env.count("TORCHELASTIC_RUN_ID"), 0u);
  EXPECT_EQ(env.at("RANK"), "11");
  EXPECT_EQ(env.at("WORLD_SIZE"), "12");
  EXPECT_EQ(env.at("LOCAL_RANK"), "3");
  EXPECT_EQ(env.at("LOCAL_WORLD_SIZE"), "4");
  EXPECT_EQ(env.at("MASTER_ADDR"), "n0");
  EXPECT_EQ(env.at("MASTER_PORT"), "29500");
  EXPECT_EQ(env.at("PATH"), "/bin");
}

TEST(LaunchLinePrefixer, KeepsLineBoundariesAcrossReads) {
  LinePrefixer p("[rank 3] ");
  EXPECT_EQ(p.feed("hel", 3), "");
  EXPECT_EQ(p.feed("lo\nwor", 6), "[rank 3] hello\n");
  EXPECT_EQ(p.feed("ld\n\nlast", 8), "[rank 3] world\n[rank 3] \n");
  EXPECT_EQ(p.last_line(), "world");  // blank lines do not count
  EXPECT_EQ(p.flush(), "[rank 3] last\n");
  EXPECT_EQ(p.last_line(), "last");
  EXPECT_EQ(p.flush(), "");
}

TEST(LaunchLinePrefixer, TheErrorLineIsKeptWhenContextLinesFollowIt) {
  LinePrefixer p("");
  const std::string text =
      "step 5\ntrainer: error: all_reduce #13 timed out\n  rank 1: step 5, in data_wait\n";
  p.feed(text.data(), text.size());
  EXPECT_EQ(p.last_line(), "  rank 1: step 5, in data_wait");
  EXPECT_EQ(p.error_line(), "trainer: error: all_reduce #13 timed out");
}

// ---- the binary ----

class LaunchCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("trainer_launch_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A synthetic run long enough (many epochs) to be interrupted; `extra` is appended TOML.
  std::string write_long_config(const std::string& extra = "") {
    const fs::path path = dir_ / "long.toml";
    std::ofstream(path)
        << "[model]\nname = \"cnn\"\nin_channels = 1\n"
           "[data]\ndataset = \"synthetic\"\nsynthetic_samples = 256\nsynthetic_image_size = 12\n"
           "batch_size = 16\nworkers = 1\n"
           "[train]\nepochs = 200\nlog_every_steps = 1\nrun_dir = \""
        << (dir_ / "run").string() << "\"\n"
        << extra;
    return path.string();
  }
  fs::path dir_;
};

TEST_F(LaunchCommand, RunsEveryRankAndPrefixesItsLines) {
  Launcher l({"--nproc-per-node", "2", "--", "version"});
  ASSERT_EQ(l.wait_exit(20), 0) << l.output();
  const std::string out = l.output();
  EXPECT_NE(out.find("[rank 0] trainer "), std::string::npos) << out;
  EXPECT_NE(out.find("[rank 1] trainer "), std::string::npos) << out;
  EXPECT_EQ(l.rank_pids().size(), 2u) << out;
  expect_gone(l.rank_pids());
}

TEST_F(LaunchCommand, FailingRankIsNamedWithItsLastErrorLine) {
  Launcher l({"--nproc-per-node=2", "--", "config", "/nonexistent.toml"});
  EXPECT_EQ(l.wait_exit(20), 1) << l.output();
  const std::string out = l.output();
  EXPECT_TRUE(std::regex_search(
      out,
      std::regex("trainer launch: rank [01] failed \\(exit status 1\\); its last error line: trainer: config "
                 "error: /nonexistent.toml: cannot open")))
      << out;
}

TEST_F(LaunchCommand, UsageErrorsExitWithTwoAndHelpExitsWithZero) {
  Launcher missing_separator({"--nproc-per-node", "2", "version"});
  EXPECT_EQ(missing_separator.wait_exit(20), 2);
  EXPECT_NE(missing_separator.output().find("missing `--`"), std::string::npos) << missing_separator.output();
  EXPECT_NE(missing_separator.output().find("trainer launch --help"), std::string::npos);
  Launcher bad_node_rank({"--nproc-per-node", "1", "--node-rank", "1", "--", "version"});
  EXPECT_EQ(bad_node_rank.wait_exit(20), 2);
  EXPECT_NE(bad_node_rank.output().find("--node-rank must be between 0 and 0"), std::string::npos)
      << bad_node_rank.output();
  Launcher help({"--help"});
  EXPECT_EQ(help.wait_exit(20), 0);
  EXPECT_NE(help.output().find("usage: trainer launch --nproc-per-node N"), std::string::npos)
      << help.output();
}

// Rank 1 cannot open its metrics port (metrics.port + LOCAL_RANK is taken) while rank 0 is ready to
// train; rank 0 then fails too (its peer left), or is stopped by the launcher: either way the summary
// names rank 1, the first to fail, with its own error.
TEST_F(LaunchCommand, FirstFailingRankIsNamedNotTheOnesItTookDown) {
  trainer::testing::TakenPort taken;
  ASSERT_NE(taken.port(), 0);
  const int metrics_port = taken.port() - 1;
  Launcher l({"--nproc-per-node", "2", "--master-port", std::to_string(free_ephemeral_port()), "--", "train",
              write_long_config(), "--set", "metrics.port=" + std::to_string(metrics_port)});
  const int code = l.wait_exit(30);
  taken.release();
  EXPECT_EQ(code, 1) << l.output();
  const std::string out = l.output();
  EXPECT_NE(out.find("trainer launch: rank 1 failed (exit status 1); its last error line: "),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("already in use"), std::string::npos) << out;
  expect_gone(l.rank_pids());
}

// `sig` sent to the launcher reaches each rank once: the ranks checkpoint and exit with 128 + sig.
void expect_forwarded(const std::string& config, int sig) {
  Launcher l({"--nproc-per-node", "2", "--master-port", std::to_string(free_ephemeral_port()), "--", "train",
              config});
  ASSERT_TRUE(l.wait_for_output("[rank 0] epoch 1/200 step ", 30)) << l.output();
  const auto pids = l.rank_pids();
  ASSERT_EQ(pids.size(), 2u) << l.output();
  ASSERT_EQ(::kill(l.pid(), sig), 0);
  const int code = l.wait_exit(15);
  EXPECT_EQ(code, 128 + sig) << l.output();
  const std::string out = l.output();
  EXPECT_NE(out.find("trainer launch: stopped by signal " + std::to_string(sig)), std::string::npos) << out;
  // Forwarded once: each rank stopped cleanly (a second signal would have killed it without a checkpoint).
  EXPECT_NE(out.find("[rank 0] checkpoint: "), std::string::npos) << out;
  const std::string status = std::to_string(128 + sig);
  EXPECT_NE(out.find("rank 0 exit status " + status + ", rank 1 exit status " + status), std::string::npos)
      << out;
  expect_gone(pids);
}

TEST_F(LaunchCommand, SigtermIsForwardedAndTheRanksExit) { expect_forwarded(write_long_config(), SIGTERM); }

// A closed terminal's SIGHUP: the launcher stays to relay the ranks' output, and they checkpoint.
TEST_F(LaunchCommand, SighupIsForwardedAndTheRanksCheckpoint) {
  expect_forwarded(write_long_config(), SIGHUP);
}

}  // namespace
}  // namespace trainer
