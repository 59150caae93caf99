// End-to-end checks of data faults found by probing the binary (issue 30): unreadable and damaged
// images in an image_folder tree, as a user meets them through `trainer train` and `trainer eval`.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/image_codec.h"
#include "trainer_process.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;
using testing::read_file;
using testing::run_trainer;
using testing::RunResult;

class DataFaults : public testing::TrainerRunTest {
 protected:
  DataFaults() : TrainerRunTest("trainer_data_faults_") {}

  void write_png(const fs::path& path, uint8_t level) {
    fs::create_directories(path.parent_path());
    const std::vector<uint8_t> pixels(16 * 16 * 3, level);
    const std::vector<uint8_t> png = encode_png(pixels.data(), 16, 16, 3);
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(png.data()), static_cast<std::streamsize>(png.size()));
  }

  // root/train/{a,b}: 8 images each; root/val/{a,b}: 5 each, of which `bad_val` are not readable images.
  fs::path write_folder(int bad_val) {
    const fs::path root = dir_ / "images";
    for (const char* cls : {"a", "b"}) {
      const uint8_t level = cls[0] == 'a' ? 40 : 200;
      for (int i = 0; i < 8; ++i) write_png(root / "train" / cls / (std::to_string(i) + ".png"), level);
      for (int i = 0; i < 5; ++i) write_png(root / "val" / cls / (std::to_string(i) + ".png"), level);
    }
    if (bad_val >= 1) std::ofstream(root / "val" / "a" / "3.png") << "not an image";
    if (bad_val >= 2) {
      fs::remove(root / "val" / "b" / "1.png");
      fs::create_symlink(root / "nowhere.png", root / "val" / "b" / "1.png");
    }
    return root;
  }

  std::string write_config(const fs::path& root, const std::string& bad_samples) {
    const fs::path path = dir_ / "folder.toml";
    std::ofstream(path) << "[model]\nname = \"cnn\"\n"
                        << "[data]\ndataset = \"image_folder\"\nroot = \"" << root.string()
                        << "\"\nimage_size = 16\nbatch_size = 4\neval_batch_size = 4\nbad_samples = \""
                        << bad_samples << "\"\n"
                        << "[train]\nepochs = 1\n";
    return path.string();
  }
};

// Skip in evaluation: the 8 readable images of 10 are evaluated, each once, and the 2 left out are
// reported in the epoch line, the summary and by `trainer eval`.
TEST_F(DataFaults, EvaluationWithSkipCountsOnlyReadableImagesAndReportsTheSkipped) {
  const std::string config = write_config(write_folder(2), "skip");
  const std::string summary = (dir_ / "summary.json").string();
  const RunResult train =
      run_trainer("train " + config + " --set train.run_dir=" + run_dir("r") + " --summary " + summary);
  ASSERT_EQ(train.exit_code, 0) << train.output;
  EXPECT_NE(train.output.find("(8 images, 2 unreadable skipped,"), std::string::npos) << train.output;
  EXPECT_NE(train.output.find("(2 unreadable test images skipped), best"), std::string::npos) << train.output;
  EXPECT_NE(read_file(summary).find("\"final_test_skipped_samples\": 2,"), std::string::npos)
      << read_file(summary);
  const RunResult eval =
      run_trainer("eval " + config + " --weights " + run_dir("r") + "/checkpoints/final.safetensors");
  ASSERT_EQ(eval.exit_code, 0) << eval.output;
  EXPECT_NE(eval.output.find(": 8 images (2 unreadable skipped, data.bad_samples = \"skip\"), loss"),
            std::string::npos)
      << eval.output;
}

// A training image that cannot be opened (a dangling link here: root opens files of mode 000) ended
// the run with SIGSEGV while the dataset was fingerprinted; now bad_samples = "error" names it.
TEST_F(DataFaults, AnImageThatCannotBeOpenedStopsTheRunNamingIt) {
  const fs::path root = write_folder(0);
  const fs::path dangling = root / "train" / "b" / "9.png";
  fs::create_symlink(root / "nowhere.png", dangling);
  const RunResult r =
      run_trainer("train " + write_config(root, "error") + " --set train.run_dir=" + run_dir("e"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(dangling.string() + ": cannot open: No such file or directory"), std::string::npos)
      << r.output;
}

// A Fashion-MNIST directory that exists but cannot be read (for root, a symbolic-link loop stands in
// for a directory without permission) is reported with its reason, not as missing with an install hint.
TEST_F(DataFaults, AnUnreadableDatasetDirectoryIsNotReportedAsMissing) {
  const fs::path loop = dir_ / "fashion";
  fs::create_symlink(loop, loop);
  const RunResult r =
      run_trainer("train " + write_small_config("") + " --set data.dataset=fashion_mnist" +
                  " --set data.root=" + loop.string() + " --set train.run_dir=" + run_dir("u"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("data.root: dataset directory '" + loop.string() +
                          "' cannot be read: Too many levels of symbolic links"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("apt-get"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace trainer
