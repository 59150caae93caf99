// The checkpoint manifest carries its own CRC-32C and is range-checked; --resume auto falls back to a
// good checkpoint, or refuses when every one is broken.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "app/common/crc32c.h"
#include "run_faults.h"

namespace {

namespace fs = std::filesystem;
using namespace trainer::testing;

// ---- 5. the manifest is checksummed and range-checked; --resume auto falls back or refuses

// Edits a checkpoint's manifest (replacing `from` by `to`) and signs it again with its CRC-32C, as a
// manifest damaged into a valid-looking one would be.
void edit_and_sign_manifest(const fs::path& checkpoint, const std::string& from, const std::string& to) {
  const fs::path manifest = checkpoint / "checkpoint.toml";
  std::string text = read_file(manifest);
  std::string body = text.substr(text.find('\n') + 1);
  const size_t at = body.find(from);
  ASSERT_NE(at, std::string::npos) << from << " in\n" << body;
  body.replace(at, from.size(), to);
  std::ofstream(manifest, std::ios::trunc)
      << "manifest_crc32c = \"" << trainer::crc32c_hex(trainer::crc32c(body.data(), body.size())) << "\"\n"
      << body;
}

TEST_F(RunFaults, ABrokenManifestIsRefusedAndResumeAutoFallsBackOrRefuses) {
  const std::string cfg = write_config("[checkpoint]\nevery_steps = 4\nkeep_last = 5\n");
  ASSERT_EQ(train(cfg, "m", "TRAINER_TEST_SIGTERM_AT_STEP=9").exit_code, 128 + 15);
  const fs::path ckpts = dir_ / "m/checkpoints";
  // batch_in_epoch past the epoch's 8 batches, correctly signed: refused by the range check.
  edit_and_sign_manifest(ckpts / "step-00000009", "batch_in_epoch = 1", "batch_in_epoch = 5000");
  const RunResult explicit_path = train(cfg, "m", "", " --resume " + (ckpts / "step-00000009").string());
  EXPECT_EQ(explicit_path.exit_code, 1) << explicit_path.output;
  EXPECT_NE(explicit_path.output.find((ckpts / "step-00000009/checkpoint.toml").string() +
                                      ": field 'batch_in_epoch' is 5000, past the epoch's 8 batches"),
            std::string::npos)
      << explicit_path.output;

  // The step against the directory's name; a plain edit against the manifest's CRC.
  edit_and_sign_manifest(ckpts / "step-00000008", "step = 8\n", "step = 11\n");
  {
    std::string text = read_file(ckpts / "step-00000004/checkpoint.toml");
    text.replace(text.find("batch_in_epoch = 4"), 18, "batch_in_epoch = 0");
    std::ofstream(ckpts / "step-00000004/checkpoint.toml", std::ios::trunc) << text;
  }
  RunResult all_broken = train(cfg, "m", "", " --resume auto");
  EXPECT_EQ(all_broken.exit_code, 1) << all_broken.output;
  EXPECT_NE(all_broken.output.find("step-00000008/checkpoint.toml: field 'step' is 11"), std::string::npos)
      << all_broken.output;
  EXPECT_NE(all_broken.output.find("step-00000004/checkpoint.toml: corrupt manifest (CRC-32C mismatch"),
            std::string::npos)
      << all_broken.output;
  EXPECT_NE(all_broken.output.find("every checkpoint in " + ckpts.string() + " is broken (3"),
            std::string::npos)
      << all_broken.output;
  EXPECT_NE(all_broken.output.find("run without --resume"), std::string::npos) << all_broken.output;
  EXPECT_EQ(all_broken.output.find("starting from scratch"), std::string::npos) << all_broken.output;

  // With a good one left (step 8 repaired), --resume auto falls back to it, loudly.
  edit_and_sign_manifest(ckpts / "step-00000008", "step = 11\n", "step = 8\n");
  const RunResult fallback = train(cfg, "m", "", " --resume auto");
  ASSERT_EQ(fallback.exit_code, 0) << fallback.output;
  EXPECT_NE(fallback.output.find("warning: --resume auto: 1 newer checkpoint(s) broken; falling back to " +
                                 (ckpts / "step-00000008").string()),
            std::string::npos)
      << fallback.output;
  EXPECT_NE(fallback.output.find("resumed from " + (ckpts / "step-00000008").string()), std::string::npos)
      << fallback.output;
}

}  // namespace
