// torchvision exports often leave out BatchNorm's num_batches_tracked: such a file loads, the counters
// set to 0 and listed in the report (one log line), while any other missing tensor stays an error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "nn/models/registry.h"
#include "nn/safetensors.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

class SafetensorsCounters : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("trainer_st_counters_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

std::shared_ptr<Module> resnet18(uint64_t seed) {
  ModelOptions o;
  o.name = "resnet18";
  o.stem = "cifar";
  o.seed = seed;
  return create_model(o);
}

bool is_counter(const std::string& name) { return name.ends_with("num_batches_tracked"); }

// The model's state without its num_batches_tracked entries, as torchvision exports may write it.
std::vector<std::pair<std::string, Tensor>> state_without_counters(Module& m) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const NamedTensor& nt : m.state_dict())
    if (!is_counter(nt.name)) out.emplace_back(nt.name, *nt.tensor);
  return out;
}

TEST_F(SafetensorsCounters, MissingCountersLoadAsZeroWithOneNote) {
  auto source = resnet18(1);
  save_safetensors(path("tv.safetensors"), state_without_counters(*source));
  auto target = resnet18(2);
  int bn_layers = 0;
  for (const NamedTensor& nt : target->state_dict())
    if (is_counter(nt.name)) {
      nt.tensor->fill_(7.0);  // must become 0, not stay as it was
      ++bn_layers;
    }
  ASSERT_EQ(bn_layers, 20);

  const ModuleLoadReport report = load_module(path("tv.safetensors"), *target);
  EXPECT_EQ(report.counters_set_to_zero.size(), 20u);
  const std::string note = report.note(path("tv.safetensors"));
  EXPECT_NE(note.find("20 BatchNorm num_batches_tracked counter(s) missing"), std::string::npos) << note;
  EXPECT_EQ(note.find('\n'), std::string::npos) << "one line: " << note;
  for (const NamedTensor& nt : target->state_dict()) {
    if (is_counter(nt.name)) EXPECT_EQ(nt.tensor->to_vector<int64_t>(), std::vector<int64_t>{0}) << nt.name;
  }
  const auto find = [](Module& m, const std::string& name) {
    for (const NamedTensor& nt : m.state_dict())
      if (nt.name == name) return nt.tensor->to_vector<float>();
    return std::vector<float>{};
  };
  EXPECT_EQ(find(*target, "conv1.weight"), find(*source, "conv1.weight"));
}

TEST_F(SafetensorsCounters, ACompleteFileReportsNothing) {
  auto m = resnet18(1);
  save_module(path("full.safetensors"), *m);
  const ModuleLoadReport report = load_module(path("full.safetensors"), *m);
  EXPECT_TRUE(report.counters_set_to_zero.empty());
  EXPECT_EQ(report.note(path("full.safetensors")), "");
}

TEST_F(SafetensorsCounters, OtherMissingTensorsStayErrors) {
  auto m = resnet18(1);
  auto state = state_without_counters(*m);
  std::erase_if(state, [](const auto& entry) { return entry.first == "bn1.running_mean"; });
  save_safetensors(path("partial.safetensors"), state);
  try {
    load_module(path("partial.safetensors"), *m);
    FAIL() << "a missing running_mean must not load";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'bn1.running_mean': missing from the file"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace trainer
