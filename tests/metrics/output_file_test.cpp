// Checked writes of the run's files (metrics/output_file.h) and the log's handling of a failed file.
#include "metrics/output_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "metrics/log.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

class OutputFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("trainer_output_file_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  static std::string read(const std::string& p) {
    std::ifstream in(p);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  fs::path dir_;
};

TEST_F(OutputFileTest, WritesAppendsAndTruncates) {
  write_whole_file(path("a.csv"), "header\n");
  OutputFile f;
  f.open(path("a.csv"), OutputFile::Mode::append);
  f.write("1\n");
  f.sync();
  EXPECT_EQ(read(path("a.csv")), "header\n1\n");
  f.write("2\n");
  f.close();
  EXPECT_EQ(read(path("a.csv")), "header\n1\n2\n");
  write_whole_file(path("a.csv"), "new\n");
  EXPECT_EQ(read(path("a.csv")), "new\n");
}

// /dev/full fails every write with ENOSPC, as a full disk does: the error names the file (not
// /dev/full), the reason and what to do.
TEST_F(OutputFileTest, AFullDiskThrowsNamingTheFile) {
  FullDiskHook hook;
  hook.names = {"train_steps.csv"};
  EXPECT_EQ(hook.target(path("train_steps.csv")), "/dev/full");
  EXPECT_EQ(hook.target(path("other.csv")), path("other.csv"));
  OutputFile f;
  f.open(path("train_steps.csv"), OutputFile::Mode::append, hook);
  f.write("1,1,0.5,0.1\n");  // buffered: nothing fails yet
  try {
    f.flush();
    FAIL() << "no error";
  } catch (const OutputFileError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cannot write " + path("train_steps.csv") + ": No space left on device"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("HINT: free space"), std::string::npos) << what;
  }
  EXPECT_THROW(write_whole_file(path("train_steps.csv"), "x\n", hook), OutputFileError);
}

// A whole-file write that fails leaves the previous file as it was (a resumed run's CSV, an earlier
// summary), not a truncated one: here the temp file's name is taken by a directory.
TEST_F(OutputFileTest, AFailedWholeFileWriteKeepsThePreviousFile) {
  write_whole_file(path("summary.json"), "{\"steps\": 16}\n");
  fs::create_directories(path("summary.json.tmp"));
  EXPECT_THROW(write_whole_file(path("summary.json"), "{}\n"), OutputFileError);
  EXPECT_EQ(read(path("summary.json")), "{\"steps\": 16}\n");
  fs::remove_all(path("summary.json.tmp"));
  write_whole_file(path("summary.json"), "{}\n");
  EXPECT_EQ(read(path("summary.json")), "{}\n");
  EXPECT_FALSE(fs::exists(path("summary.json.tmp")));
}

// The environment variable itself is read at start-up (FaultInjection, tests/app/fault_injection_test.cpp).
TEST_F(OutputFileTest, TheHookNamesFilesFromTheVariablesValue) {
  const FullDiskHook hook = full_disk_hook_from("summary.json,train.log");
  EXPECT_EQ(hook.names, (std::set<std::string>{"summary.json", "train.log"}));
  EXPECT_TRUE(full_disk_hook_from("").names.empty());
}

// A log file that cannot be written: training goes on (the console has every line), the failure is
// reported once and remembered for the exit status.
TEST_F(OutputFileTest, ALogFileThatFailsIsReportedOnceAndRemembered) {
  Log& log = Log::instance();
  FullDiskHook hook;
  hook.names = {"train.log"};
  log.open_file(path("train.log"), hook);
  ::testing::internal::CaptureStderr();
  log.line("first");
  log.line("second");
  log.error("an error");
  const std::string err = ::testing::internal::GetCapturedStderr();
  log.close_file();
  const std::string warning = "warning: cannot write " + path("train.log");
  ASSERT_NE(err.find(warning), std::string::npos) << err;
  EXPECT_EQ(err.find(warning, err.find(warning) + 1), std::string::npos) << err;
  EXPECT_NE(log.file_failure().find("No space left on device"), std::string::npos);
  // A new file starts clean.
  log.open_file(path("good.log"));
  log.line("kept");
  log.close_file();
  EXPECT_EQ(log.file_failure(), "");
  const std::string kept = read(path("good.log"));  // "<UTC time> kept\n"
  EXPECT_EQ(kept.substr(kept.find(' ') + 1), "kept\n") << kept;
}

}  // namespace
}  // namespace trainer
