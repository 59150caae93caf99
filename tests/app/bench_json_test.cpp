// The records `trainer bench` and `trainer bench-data` write (bench.json, loader_bench.json) are built
// with nlohmann-json: any string is escaped, bytes that are not UTF-8 do not lose the record, NaN is
// null, and figures keep the digits the hand-written files had.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "app/commands/bench/bench_runs.h"
#include "app/common/json_text.h"

namespace trainer {
namespace {

TEST(JsonText, EscapesEveryStringAndReplacesBytesThatAreNotUtf8) {
  for (const std::string s : {"", "plain", "a \"b\" \\ c", "tab\there\nnew\x01\x1f", "\xe2\x82\xac"})
    EXPECT_EQ(nlohmann::json::parse(json_text(nlohmann::ordered_json(s))), s);
  EXPECT_EQ(nlohmann::json::parse(json_text(nlohmann::ordered_json("bad\xc3"))), "bad\xef\xbf\xbd");
  const std::string text = json_text({{"b", NAN}, {"a", 1}});
  EXPECT_EQ(text, "{\n  \"b\": null,\n  \"a\": 1\n}\n");  // keys in the order written
}

TEST(JsonText, RoundedAndSignificantReadAsPrintfWritesThem) {
  EXPECT_EQ(nlohmann::ordered_json(rounded(1234.56789, 3)).dump(), "1234.568");
  EXPECT_EQ(nlohmann::ordered_json(rounded(1.0, 4)).dump(), "1.0");
  EXPECT_EQ(nlohmann::ordered_json(significant(0.05 * 16 / 128, 6)).dump(), "0.00625");
  EXPECT_EQ(nlohmann::ordered_json(significant(1.0 / 3.0, 6)).dump(), "0.333333");
  EXPECT_TRUE(std::isnan(rounded(NAN, 4)));
}

TEST(BenchJson, EnvironmentAndGridPointHaveTheirFieldsInOrder) {
  SystemInfo s;
  s.hostname = "node\xff";
  s.cpu_cores = 8;
  s.gpus.push_back({0, "NVIDIA H200", 150000000000, 9, 0});
  s.nccl_env = {{"NCCL_DEBUG", "WARN"}, {"NCCL_SOCKET_IFNAME", "eth0"}};
  TrainerBuild b;
  b.version = "0.1.0";
  const nlohmann::json env = nlohmann::json::parse(json_text(bench::environment_json(s, b)));
  EXPECT_EQ(env.at("hostname"), "node\xef\xbf\xbd");
  EXPECT_EQ(env.at("cpu_cores"), 8);
  EXPECT_EQ(env.at("version"), "0.1.0");
  ASSERT_EQ(env.at("gpus").size(), 1u);
  EXPECT_EQ(env.at("gpus")[0].at("name"), "NVIDIA H200");
  EXPECT_EQ(env.at("gpus")[0].at("memory_bytes"), 150000000000);
  EXPECT_EQ(env.at("nccl_env").at("NCCL_SOCKET_IFNAME"), "eth0");

  bench::GridPoint p;
  p.procs = 2;
  p.batch = 16;
  p.global_batch = 32;
  p.precision = "bf16";
  p.lr = 0.05 * 32 / 128;
  EXPECT_EQ(bench::grid_point_json(p).dump(),
            R"({"procs":2,"batch_per_rank":16,"global_batch":32,"precision":"bf16","lr":0.0125})");
}

}  // namespace
}  // namespace trainer
