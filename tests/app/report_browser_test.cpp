// report.html in a real browser: Debian's headless Chromium loads the report of two short real runs
// (one rank, and two ranks under `trainer launch`),
// runs its inline script and dumps the DOM. The page must raise no script error, and every series the
// page holds (data-series) must have been laid out with a non-empty box (data-drawn-series, written by
// the page's script from getBBox). Skipped, saying how to enable it, where /usr/bin/chromium is missing.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <regex>
#include <string>

#include "dist/multi_process.h"
#include "trainer_process.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

constexpr const char* kChromium = "/usr/bin/chromium";

class ReportBrowserTest : public testing::TrainerRunTest {
 protected:
  ReportBrowserTest() : TrainerRunTest("report_browser_") {}
};

struct Output {
  int status;
  std::string text;
};

Output run_shell(const std::string& cmd) {
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  return {pclose(pipe), out};
}

// The flags that let Chromium run headless as root in a container, offline, with a profile of its own.
std::string chromium_command(const fs::path& profile) {
  return std::string(kChromium) +
         " --headless --no-sandbox --disable-gpu --disable-quic --no-first-run "
         "--disable-background-networking"
         " --disable-component-update --disable-sync --user-data-dir=" +
         profile.string();
}

int attribute(const std::string& dom, const std::string& name) {
  std::smatch m;
  if (!std::regex_search(dom, m, std::regex(name + "=\"([0-9]+)\""))) return -1;
  return std::stoi(m[1].str());
}

TEST_F(ReportBrowserTest, ChromiumDrawsEverySeriesWithoutScriptErrors) {
  if (!fs::exists(kChromium))
    GTEST_SKIP() << kChromium
                 << " is missing: install Debian's chromium package (apt-get install "
                    "--no-install-recommends chromium) to check report.html in a browser";
  const std::string config = write_small_config("[train]\nepochs = 2\n");
  // Real Fashion-MNIST (Debian's dataset-fashion-mnist), 40 steps, on one rank; and two ranks under
  // the launcher (rank 0 writes the run's files).
  const auto one = testing::run_trainer("train " TRAINER_SOURCE_DIR
                                        "/configs/fashion_mnist_cnn.toml --set train.max_steps=40 --set "
                                        "train.run_dir=" +
                                        run_dir("a"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const auto two = testing::run_trainer("launch --nproc-per-node 2 --master-port " +
                                        std::to_string(testing::free_port(2)) + " -- train " + config +
                                        " --set train.run_dir=" + run_dir("b"));
  ASSERT_EQ(two.exit_code, 0) << two.output;
  const fs::path html = dir_ / "report.html";
  const auto rep =
      testing::run_trainer("report " + run_dir("a") + " " + run_dir("b") + " --out " + html.string());
  ASSERT_EQ(rep.exit_code, 0) << rep.output;

  const Output dom =
      run_shell(chromium_command(dir_ / "profile") + " --enable-logging=stderr --v=0 --dump-dom file://" +
                html.string() + " 2>" + (dir_ / "chromium.err").string());
  const std::string log = testing::read_file(dir_ / "chromium.err");
  ASSERT_EQ(dom.status, 0) << log;
  EXPECT_EQ(log.find("Uncaught"), std::string::npos) << log;
  EXPECT_EQ(log.find(":CONSOLE"), std::string::npos) << log;  // no console message of any kind

  // Per run: train loss, test loss, top-1, top-5, LR, throughput per window and per epoch, loss over
  // wall-clock time (train_steps.csv has wall_time), 7 phases.
  const int expected = attribute(dom.text, "data-expected-series");
  EXPECT_EQ(expected, 2 * (8 + 7)) << dom.text.substr(0, 2000);
  EXPECT_EQ(attribute(dom.text, "data-drawn-series"), expected)
      << "the page's script did not run to the end, or some series has an empty box";
}

}  // namespace
}  // namespace trainer
