// The README's list of what scripts/install-deps.sh installs is the script's own list, word for word:
// users installing by hand follow the README.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "trainer_process.h"

namespace trainer {
namespace {

// The words of the script's `packages=( ... )` array, comments left out, one space between them.
std::string script_packages(const std::string& script) {
  const size_t begin = script.find("packages=(");
  const size_t end = script.find("\n)", begin);
  std::stringstream lines(script.substr(begin + 10, end - begin - 10));
  std::string out;
  for (std::string line; std::getline(lines, line);) {
    std::stringstream words(line.substr(0, line.find('#')));
    for (std::string w; words >> w;) out += (out.empty() ? "" : " ") + w;
  }
  return out;
}

// The README with every run of whitespace made one space.
std::string squeezed(const std::string& text) {
  std::stringstream words(text);
  std::string out;
  for (std::string w; words >> w;) out += (out.empty() ? "" : " ") + w;
  return out;
}

TEST(ReadmeDeps, ListsExactlyTheInstallScriptsPackages) {
  const std::string packages =
      script_packages(testing::read_file(TRAINER_SOURCE_DIR "/scripts/install-deps.sh"));
  ASSERT_NE(packages.find("build-essential"), std::string::npos) << packages;
  const std::string readme = squeezed(testing::read_file(TRAINER_SOURCE_DIR "/README.md"));
  EXPECT_NE(readme.find("`" + packages + "`"), std::string::npos)
      << "README.md should list, between backticks: " << packages;
}

}  // namespace
}  // namespace trainer
