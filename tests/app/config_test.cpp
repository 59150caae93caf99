// Config loading: defaults, overrides, round trips, and above all the error messages, which must
// always point at file:line:column (or the --set argument) and name the key.
#include "app/config/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace trainer {
namespace {

namespace fs = std::filesystem;

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("trainer_config_test_" + std::to_string(::getpid()) + "_" + info->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }

  // Loads and expects a ConfigError whose message contains every one of `parts`.
  std::string expect_error(const std::string& path, const std::vector<std::string>& overrides,
                           const std::vector<std::string>& parts) {
    try {
      load_config(path, overrides);
    } catch (const ConfigError& e) {
      const std::string message = e.what();
      for (const auto& part : parts)
        EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
      return message;
    }
    ADD_FAILURE() << "no ConfigError for " << path;
    return "";
  }

  fs::path dir_;
};

TEST_F(ConfigTest, EmptyFileGivesDefaults) {
  const Config config = load_config(write("empty.toml", ""));
  EXPECT_EQ(config, Config{});
  EXPECT_EQ(config.model.name, "cnn");
  EXPECT_EQ(config.data.dataset, "fashion_mnist");
  EXPECT_EQ(config.data.batch_size, 128);
  EXPECT_EQ(config.data.workers, -1);
  EXPECT_EQ(config.train.epochs, 4);
  EXPECT_EQ(config.train.precision, Precision::fp32);
  EXPECT_DOUBLE_EQ(config.optim.lr, 0.1);
  EXPECT_DOUBLE_EQ(config.optim.weight_decay, 5e-4);
  EXPECT_EQ(config.optim.betas, (std::vector<double>{0.9, 0.999}));
  EXPECT_EQ(config.schedule.name, ScheduleKind::cosine);
  EXPECT_EQ(config.dist.timeout_seconds, 300);
  EXPECT_EQ(config.checkpoint.keep_last, 3);
  EXPECT_EQ(config.metrics.port, 0);
  for (const auto& key : config_keys()) EXPECT_EQ(config.origin.at(key), "(default)") << key;
}

TEST_F(ConfigTest, ReadsEveryKindOfValueAndRecordsPositions) {
  const std::string path = write("good.toml",
                                 "[model]\n"
                                 "name = \"resnet18\"\n"
                                 "[data]\n"
                                 "normalize_mean = [0.5, 0.25, 1]\n"
                                 "normalize_std = [0.5, 0.25, 1]\n"
                                 "[train]\n"
                                 "epochs = 3\n"
                                 "seed = 12345678901\n"
                                 "[optim]\n"
                                 "lr = 1\n"
                                 "nesterov = true\n"
                                 "[schedule]\n"
                                 "milestones = [3, 6]\n");
  const Config config = load_config(path);
  EXPECT_EQ(config.model.name, "resnet18");
  EXPECT_EQ(config.data.normalize_mean, (std::vector<double>{0.5, 0.25, 1.0}));
  EXPECT_EQ(config.train.epochs, 3);
  EXPECT_EQ(config.train.seed, 12345678901);
  EXPECT_DOUBLE_EQ(config.optim.lr, 1.0);  // an integer is a fine float
  EXPECT_TRUE(config.optim.nesterov);
  EXPECT_EQ(config.schedule.milestones, (std::vector<int>{3, 6}));
  EXPECT_EQ(config.origin.at("train.epochs"), path + ":7:10");
  EXPECT_EQ(config.origin.at("model.name"), path + ":2:8");
}

TEST_F(ConfigTest, MissingFileNamesThePath) {
  const std::string path = (dir_ / "nope.toml").string();
  expect_error(path, {}, {path, "cannot open"});
}

TEST_F(ConfigTest, UnknownKeyWithSuggestion) {
  const std::string path = write("x.toml", "[optim]\nlr = 0.1\nlrr = 0.2\n");
  expect_error(path, {}, {path + ":3:1: unknown key 'optim.lrr' (did you mean 'optim.lr'?)"});
}

TEST_F(ConfigTest, KeyInTheWrongSectionSuggestsTheRightOne) {
  const std::string path = write("x.toml", "epochs = 3\n[train]\nlr = 0.1\n");
  expect_error(path, {},
               {path + ":1:1: unknown key 'epochs' (did you mean 'train.epochs'?)",
                path + ":3:1: unknown key 'train.lr' (did you mean 'optim.lr'?)"});
}

TEST_F(ConfigTest, UnknownSection) {
  const std::string path = write("x.toml", "[train]\nepochs = 2\n\n[optimizer]\nlr = 0.1\n");
  expect_error(path, {}, {path + ":4:2: unknown section '[optimizer]' (did you mean '[optim]'?)"});
  const std::string far = write("y.toml", "[zzzzzzzz]\n");
  expect_error(far, {}, {far + ":1:2: unknown section '[zzzzzzzz]'", "sections are [model], [data]"});
}

TEST_F(ConfigTest, SectionThatIsNotATable) {
  const std::string path = write("x.toml", "train = 3\n");
  expect_error(path, {}, {path + ":1:9: train: expected a table"});
}

TEST_F(ConfigTest, WrongType) {
  const std::string path = write("x.toml", "[optim]\n\nname = \"sgd\"\nlr = \"fast\"\n");
  expect_error(path, {}, {path + ":4:6: optim.lr: expected a float, got string \"fast\""});
}

TEST_F(ConfigTest, FloatForAnIntegerKeyIsATypeError) {
  const std::string path = write("x.toml", "[train]\nepochs = 3.0\n");
  expect_error(path, {}, {path + ":2:10: train.epochs: expected an integer, got float 3"});
}

TEST_F(ConfigTest, WrongArrayElementType) {
  const std::string path = write("x.toml", "[data]\nnormalize_mean = [0.5, \"a\"]\nnormalize_std = [1, 1]\n");
  expect_error(path, {}, {path + ":2:24: data.normalize_mean[1]: expected a float, got string \"a\""});
}

TEST_F(ConfigTest, OutOfRange) {
  const std::string path = write("x.toml", "[train]\nepochs = 0\n");
  expect_error(path, {}, {path + ":2:10: train.epochs: must be >= 1, got 0"});
  const std::string dropout = write("d.toml", "[model]\ndropout = 1.0\n");
  expect_error(dropout, {}, {dropout + ":2:11: model.dropout: must be in [0, 1), got 1"});
  const std::string workers = write("w.toml", "[data]\nworkers = -2\n");
  expect_error(workers, {}, {workers + ":2:11: data.workers: must be -1 (auto) or >= 0, got -2"});
  const std::string huge = write("h.toml", "[train]\nepochs = 3000000000\n");
  expect_error(huge, {}, {huge + ":2:10: train.epochs: must be <= 2147483647"});
  const std::string nan = write("n.toml", "[optim]\nlr = nan\n");
  expect_error(nan, {}, {nan + ":2:6: optim.lr: must be a finite number"});
}

TEST_F(ConfigTest, ArrayRules) {
  const std::string betas = write("b.toml", "[optim]\nbetas = [0.9, 0.99, 0.999]\n");
  expect_error(betas, {}, {betas + ":2:9: optim.betas: must have exactly 2 elements, got 3"});
  const std::string std_zero =
      write("s.toml", "[data]\nnormalize_mean = [0.5, 0.5]\nnormalize_std = [0.5, 0]\n");
  expect_error(std_zero, {}, {std_zero + ":3:23: data.normalize_std[1]: must be > 0, got 0"});
  const std::string order = write("m.toml", "[schedule]\nmilestones = [30, 20]\n");
  expect_error(order, {},
               {order + ":2:19: schedule.milestones[1]: must be greater than the element before it"});
}

TEST_F(ConfigTest, BadEnumValue) {
  const std::string path = write("x.toml", "[model]\nname = \"resnet\"\n");
  expect_error(
      path, {},
      {path + ":2:8: model.name: must be one of \"mlp\", \"cnn\", \"resnet18\", \"resnet34\", "
              "\"resnet50\", \"vit_b_16\", \"vit_s_16\", \"vit\", \"convnext_tiny\", \"convnext\"; got "
              "\"resnet\" (did you mean \"resnet18\"?)"});
}

TEST_F(ConfigTest, SyntaxError) {
  const std::string path = write("x.toml", "[train]\nepochs = 3\nseed = = 4\n");
  expect_error(path, {}, {path + ":3:", "TOML syntax error"});
  const std::string duplicate = write("d.toml", "[train]\nepochs = 3\nepochs = 4\n");
  expect_error(duplicate, {}, {duplicate + ":3:", "TOML syntax error"});
}

TEST_F(ConfigTest, ReportsEveryProblemInFileOrder) {
  const std::string path = write("x.toml", "[train]\nepochs = 0\n[optim]\nlr = -1\nfoo = 1\n");
  const std::string message =
      expect_error(path, {}, {":2:10: train.epochs", ":4:6: optim.lr", ":5:1: unknown key"});
  EXPECT_LT(message.find("train.epochs"), message.find("optim.lr"));
  EXPECT_LT(message.find("optim.lr"), message.find("optim.foo"));
}

TEST_F(ConfigTest, BadOverrides) {
  const std::string path = write("x.toml", "[optim]\nlr = 0.1\n");
  expect_error(path, {"optim.lr=abc"},
               {"--set optim.lr=abc: optim.lr: expected a float, got string \"abc\""});
  expect_error(path, {"optim.lrr=1"},
               {"--set optim.lrr=1: unknown key 'optim.lrr' (did you mean 'optim.lr'?)"});
  expect_error(path, {"optim.lr"}, {"--set optim.lr: expected section.key=value"});
  expect_error(path, {"train.epochs=0"}, {"--set train.epochs=0: train.epochs: must be >= 1, got 0"});
  expect_error(path, {"optim.name=adam"}, {"--set optim.name=adam: optim.name: must be one of"});
  expect_error(path, {"data.normalize_mean=[0.5, \"x\"]"},
               {"--set data.normalize_mean=[0.5, \"x\"]: data.normalize_mean[1]: expected a float"});
}

TEST_F(ConfigTest, CrossKeyChecks) {
  const std::string lengths =
      write("l.toml", "[data]\nnormalize_mean = [0.5, 0.5, 0.5]\nnormalize_std = [0.25]\n");
  expect_error(
      lengths, {},
      {lengths + ":3:17: data.normalize_std: must have as many elements as data.normalize_mean (3), got 1"});
  const std::string mean_only = write("m.toml", "[data]\nnormalize_mean = [0.5]\n");
  expect_error(mean_only, {}, {mean_only + ":2:18: data.normalize_mean: has 1 elements"});
  const std::string nesterov = write("n.toml", "[optim]\nmomentum = 0.0\nnesterov = true\n");
  expect_error(nesterov, {}, {nesterov + ":3:12: optim.nesterov: true requires optim.momentum > 0"});
  expect_error(nesterov, {"optim.nesterov=true", "optim.momentum=0"},
               {"--set optim.nesterov=true: optim.nesterov: true requires optim.momentum > 0"});
  const std::string multistep = write("s.toml", "[schedule]\nname = \"multistep\"\n");
  expect_error(multistep, {},
               {multistep + ":2:8: schedule.name: schedule \"multistep\" needs schedule.milestones"});
}

// A size key for a model it does not size stops the load instead of being ignored (a run would
// silently train another model than the config describes).
TEST_F(ConfigTest, ModelSizeKeysMustSizeTheNamedModel) {
  const std::string fixed_vit = write("v.toml", "[model]\nname = \"vit_b_16\"\ndepth = 8\n");
  expect_error(fixed_vit, {},
               {fixed_vit + ":3:9: model.depth: sizes model 'vit' (vit_b_16 and vit_s_16 have fixed sizes), "
                            "not 'vit_b_16'"});
  const std::string cnn = write("c.toml", "[model]\nname = \"cnn\"\n");
  expect_error(cnn, {"model.depths=[1, 1, 1, 1]"}, {"model.depths: sizes model 'convnext'", "not 'cnn'"});
  expect_error(cnn, {"model.width=32"}, {"model.width: sizes model 'vit' and the ResNets"});
  const Config vit = load_config(
      write("ok.toml", "[model]\nname = \"vit\"\npatch_size = 7\ndepth = 2\nheads = 2\nwidth = 32\n"));
  EXPECT_EQ(vit.model.patch_size, 7);
  EXPECT_EQ(vit.model.width, 32);
  const Config convnext =
      load_config(cnn, {"model.name=convnext", "model.depths=[1, 1, 2, 1]", "model.drop_path=0.2"});
  EXPECT_EQ(convnext.model.depths, (std::vector<int>{1, 1, 2, 1}));
  EXPECT_EQ(convnext.model.drop_path, 0.2);
}

TEST_F(ConfigTest, OverridesWinAndLaterOnesWinOverEarlier) {
  const std::string path = write("x.toml", "[train]\nepochs = 3\n[optim]\nname = \"sgd\"\n");
  const Config config =
      load_config(path, {"train.epochs=5", "train.epochs = 7", "optim.name=adamw", "model.name=\"mlp\"",
                         "data.normalize_mean=[0.5]", "data.normalize_std=[0.25]", "train.run_dir=runs/a b",
                         "data.root=2024", "checkpoint.dir="});
  EXPECT_EQ(config.train.epochs, 7);
  EXPECT_EQ(config.origin.at("train.epochs"), "--set train.epochs = 7");
  EXPECT_EQ(config.optim.name, OptimizerKind::adamw);  // bare word: not TOML, taken as a string
  EXPECT_EQ(config.origin.at("optim.name"), "--set optim.name=adamw");
  EXPECT_EQ(config.model.name, "mlp");
  EXPECT_EQ(config.data.normalize_mean, std::vector<double>{0.5});
  EXPECT_EQ(config.data.normalize_std, std::vector<double>{0.25});
  EXPECT_EQ(config.train.run_dir, "runs/a b");
  EXPECT_EQ(config.data.root, "2024");  // a string key takes an unquoted number as text
  EXPECT_EQ(config.checkpoint.dir, "");
  EXPECT_EQ(config.origin.at("model.stem"), "(default)");
}

TEST_F(ConfigTest, OverridesWithoutAFile) {
  const Config config = load_config("", {"train.epochs=2"});
  EXPECT_EQ(config.train.epochs, 2);
  EXPECT_EQ(config.model, ModelConfig{});
}

TEST_F(ConfigTest, ConfigErrorAtPointsWhereTheKeyCameFrom) {
  const std::string path = write("x.toml", "[data]\n\nroot    = \"/nope\"\n");
  const Config from_file = load_config(path);
  EXPECT_EQ(std::string(config_error_at(from_file, "data.root", "directory '/nope' does not exist").what()),
            path + ":3:11: data.root: directory '/nope' does not exist");
  const Config from_set = load_config(path, {"data.root=/else"});
  EXPECT_EQ(std::string(config_error_at(from_set, "data.root", "missing").what()),
            "--set data.root=/else: data.root: missing");
  EXPECT_EQ(std::string(config_error_at(from_file, "model.name", "unsupported").what()),
            path + " (default): model.name: unsupported");
}

TEST_F(ConfigTest, TomlRoundTrip) {
  const std::string path =
      write("x.toml",
            "[model]\nname = \"resnet50\"\ndropout = 0.1\nsync_bn = true\n"
            "[data]\nroot = \"/data/with \\\"quotes\\\" and \\\\ back\"\n"
            "normalize_mean = [0.4914, 0.4822, 0.4465]\nnormalize_std = [0.247, 0.243, 0.261]\n"
            "[optim]\nlr = 3\neps = 1e-12\nbetas = [0.8, 0.95]\nweight_decay = 0.1\n"
            "[schedule]\nname = \"multistep\"\nmilestones = [1, 5, 9]\ngamma = 0.3333333333333333\n"
            "[train]\nseed = 9007199254740993\n");
  const Config config = load_config(path, {"metrics.port=9100", "train.run_dir=\"tab\\there\""});
  const std::string text = config_to_toml(config);
  const Config reloaded = load_config(write("resolved.toml", text));
  EXPECT_EQ(reloaded, config) << text;
  const std::string again = config_to_toml(reloaded);  // stable: same text, apart from the header comment
  EXPECT_EQ(again.substr(again.find("\n[")), text.substr(text.find("\n[")));
  // Every key is written out, not only those that differ from the defaults.
  for (const auto& key : config_keys()) EXPECT_NE(reloaded.origin.at(key), "(default)") << key;
  EXPECT_LT(text.find("[model]"), text.find("[data]"));
  EXPECT_LT(text.find("[checkpoint]"), text.find("[metrics]"));
}

TEST_F(ConfigTest, TableShowsValueAndSource) {
  const std::string path = write("x.toml", "[train]\nepochs = 3\n");
  const std::string table = config_table(load_config(path, {"optim.lr=0.5"}));
  EXPECT_NE(table.find("train.epochs"), std::string::npos);
  EXPECT_NE(table.find("[" + path + ":2:10]"), std::string::npos) << table;
  EXPECT_NE(table.find("0.5"), std::string::npos);
  EXPECT_NE(table.find("[--set]"), std::string::npos);
  EXPECT_NE(table.find("[default]"), std::string::npos);
  EXPECT_EQ(static_cast<std::size_t>(std::count(table.begin(), table.end(), '\n')), config_keys().size());
}

TEST_F(ConfigTest, ReferenceConfigLoadsAndEqualsTheDefaults) {
  const std::string path = std::string(TRAINER_SOURCE_DIR) + "/configs/reference.toml";
  const Config config = load_config(path);
  EXPECT_EQ(config, Config{});
  // It documents every key: none may be missing from the file.
  for (const auto& key : config_keys()) EXPECT_NE(config.origin.at(key), "(default)") << key << " missing";
}

TEST_F(ConfigTest, DefaultRunDirUsesTheConfigStem) {
  Config config;
  config.source_path = "configs/fmnist_cnn.toml";
  const std::string dir = default_run_dir(config, 0);
  EXPECT_EQ(dir.rfind("runs/fmnist_cnn-19", 0), 0u) << dir;  // local time of the epoch: 1969 or 1970
  EXPECT_EQ(dir.size(), std::string("runs/fmnist_cnn-19700101-000000").size());
}

}  // namespace
}  // namespace trainer
