// Every safetensors file the trainer writes carries a CRC-32C per tensor, and `trainer eval` checks it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "nn/safetensors.h"
#include "run_faults.h"

namespace {

namespace fs = std::filesystem;
using namespace trainer::testing;

// ---- 4. weights carry CRC-32Cs and eval checks them

// The byte offset of tensor `name`'s data in a safetensors file.
size_t tensor_data_offset(const fs::path& file, const std::string& name) {
  const std::string bytes = read_file(file);
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = header_size << 8 | static_cast<unsigned char>(bytes[i]);
  const std::string header = bytes.substr(8, header_size);
  const size_t entry = header.find("\"" + name + "\"");
  const size_t offsets = header.find("data_offsets", entry);
  const size_t begin = header.find('[', offsets) + 1;
  return 8 + header_size + std::stoull(header.substr(begin));
}

void flip_a_bit(const fs::path& file, size_t offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  const char byte = static_cast<char>(f.get());
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(byte ^ 0x40));
}

TEST_F(RunFaults, EvalChecksTheCrcOfEveryTensorNamingACorruptOne) {
  const std::string cfg = write_config("[checkpoint]\nevery_steps = 8\nkeep_last = 5\n");
  ASSERT_EQ(train(cfg, "w").exit_code, 0);
  const fs::path final_weights = dir_ / "w/checkpoints/final.safetensors";
  trainer::SafetensorsMetadata meta;
  const auto tensors = trainer::load_safetensors(final_weights.string(), &meta);
  for (const auto& [name, t] : tensors) EXPECT_EQ(meta.count("crc32c." + name), 1u) << name;

  const std::string eval = "eval " + cfg + " --weights ";
  const RunResult good = run_trainer(eval + final_weights.string());
  ASSERT_EQ(good.exit_code, 0) << good.output;
  EXPECT_NE(good.output.find("every tensor matches its CRC-32C"), std::string::npos) << good.output;

  for (const fs::path& file : {final_weights, dir_ / "w/checkpoints/step-00000008/model.safetensors"}) {
    flip_a_bit(file, tensor_data_offset(file, "conv1.weight") + 3);
    const RunResult bad = run_trainer(eval + file.string());
    EXPECT_EQ(bad.exit_code, 1) << bad.output;
    EXPECT_NE(bad.output.find(file.string() + ": tensor 'conv1.weight' is corrupt"), std::string::npos)
        << bad.output;
    EXPECT_NE(bad.output.find("--no-verify-crc"), std::string::npos) << bad.output;
    EXPECT_EQ(bad.output.find("top1"), std::string::npos) << bad.output;
    const RunResult skipped = run_trainer(eval + file.string() + " --no-verify-crc");
    EXPECT_EQ(skipped.exit_code, 0) << skipped.output;
    EXPECT_NE(skipped.output.find("CRC-32C not checked"), std::string::npos) << skipped.output;
  }

  // A foreign file (no CRC metadata, like a torchvision export) loads, with one line saying so.
  const fs::path foreign = dir_ / "foreign.safetensors";
  std::vector<std::pair<std::string, trainer::Tensor>> plain(tensors.begin(), tensors.end());
  trainer::save_safetensors(foreign.string(), plain);
  const RunResult unverified = run_trainer(eval + foreign.string());
  EXPECT_EQ(unverified.exit_code, 0) << unverified.output;
  EXPECT_EQ(count_of(unverified.output, "not verified, the file carries no CRC-32C"), 1u)
      << unverified.output;
}

}  // namespace
