// dist.backend: "tcp" names our own CPU communicator; the old name "gloo" is still read, as "tcp", with
// one warning that ends up once in the run log (config_table), and anything else is an error naming
// the key.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "app/config/config.h"

namespace trainer {
namespace {

std::size_t count(const std::string& text, const std::string& part) {
  std::size_t n = 0;
  for (auto at = text.find(part); at != std::string::npos; at = text.find(part, at + part.size())) ++n;
  return n;
}

TEST(DistBackendConfig, TcpIsReadSilently) {
  const Config config = load_config("", {"dist.backend=tcp"});
  EXPECT_EQ(config.dist.backend, CommBackendChoice::tcp);
  EXPECT_TRUE(config.warnings.empty());
  EXPECT_EQ(config_table(config).find("warning"), std::string::npos) << config_table(config);
}

TEST(DistBackendConfig, GlooIsReadAsTcpWithOneWarningNamingWhere) {
  const Config config = load_config("", {"dist.backend=gloo"});
  EXPECT_EQ(config.dist.backend, CommBackendChoice::tcp);
  ASSERT_EQ(config.warnings.size(), 1u);
  const std::string& warning = config.warnings[0];
  EXPECT_NE(warning.find("--set dist.backend=gloo: dist.backend = \"gloo\""), std::string::npos) << warning;
  EXPECT_NE(warning.find("our own TCP"), std::string::npos) << warning;
  EXPECT_NE(warning.find("write \"tcp\""), std::string::npos) << warning;
  EXPECT_EQ(count(config_table(config), "warning: "), 1u) << config_table(config);
  // What checkpoints store is the new name, so a resumed run does not warn again.
  EXPECT_EQ(count(config_to_toml(config), "backend = \"tcp\""), 1u);
}

TEST(DistBackendConfig, GlooInAFileWarnsWithItsPosition) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("trainer_dist_backend_" + std::to_string(::getpid()) + ".toml"))
                               .string();
  std::ofstream(path) << "[dist]\nbackend = \"gloo\"\n";
  const Config config = load_config(path);
  std::filesystem::remove(path);
  ASSERT_EQ(config.warnings.size(), 1u);
  EXPECT_EQ(config.warnings[0].rfind(path + ":2:11: dist.backend", 0), 0u) << config.warnings[0];
  EXPECT_EQ(config, load_config("", {"dist.backend=tcp"}));
}

TEST(DistBackendConfig, AnUnknownBackendIsAnErrorNamingTheKey) {
  try {
    load_config("", {"dist.backend=mpi"});
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("dist.backend"), std::string::npos) << message;
    EXPECT_NE(message.find("\"tcp\""), std::string::npos) << message;
    // The old name is accepted but not offered.
    EXPECT_EQ(message.find("gloo"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace trainer
