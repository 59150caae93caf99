#include "data/idx.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <string>
#include <vector>

#include "data/data_error.h"
#include "data/error_of.h"
#include "data/temp_dir.h"
#include "nn/random.h"

namespace trainer {
namespace {

using testing::error_of;
using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;

IdxImages make_images(int64_t count, int64_t rows, int64_t cols, uint64_t seed = 1) {
  IdxImages images;
  images.count = count;
  images.rows = rows;
  images.cols = cols;
  Generator gen(seed);
  for (int64_t i = 0; i < count * rows * cols; ++i)
    images.pixels.push_back(static_cast<uint8_t>(gen.below(256)));
  return images;
}

void write_gzip_members(const std::string& path, const std::vector<std::vector<uint8_t>>& members) {
  std::vector<uint8_t> all;
  for (size_t m = 0; m < members.size(); ++m) {
    const std::string part = path + ".part";
    gzFile file = gzopen(part.c_str(), "wb");
    ASSERT_NE(file, nullptr);
    ASSERT_EQ(gzwrite(file, members[m].data(), static_cast<unsigned>(members[m].size())),
              static_cast<int>(members[m].size()));
    ASSERT_EQ(gzclose(file), Z_OK);
    const std::vector<uint8_t> bytes = read_bytes(part);
    all.insert(all.end(), bytes.begin(), bytes.end());
  }
  write_bytes(path, all);
}

class IdxRoundTrip : public ::testing::TestWithParam<bool> {};

TEST_P(IdxRoundTrip, ImagesAndLabelsReadBackExactly) {
  const bool gzip = GetParam();
  TempDir dir;
  const IdxImages written = make_images(5, 3, 4);
  const std::vector<uint8_t> labels = {0, 9, 3, 3, 7};
  write_idx_images(dir.file("images"), written, gzip);
  write_idx_labels(dir.file("labels"), labels, gzip);
  EXPECT_EQ(read_bytes(dir.file("images"))[0] == 0x1f, gzip);

  const IdxImages read = read_idx_images(dir.file("images"));
  EXPECT_EQ(read.count, 5);
  EXPECT_EQ(read.rows, 3);
  EXPECT_EQ(read.cols, 4);
  EXPECT_EQ(read.pixels, written.pixels);
  EXPECT_EQ(read_idx_labels(dir.file("labels"), 10).labels, labels);
}

INSTANTIATE_TEST_SUITE_P(GzipAndRaw, IdxRoundTrip, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "gzip" : "raw"; });

TEST(Idx, ContentHashIgnoresCompressionButNotContent) {
  TempDir dir;
  write_idx_images(dir.file("a.gz"), make_images(4, 2, 2, 1), true);
  write_idx_images(dir.file("a"), make_images(4, 2, 2, 1), false);
  write_idx_images(dir.file("b"), make_images(4, 2, 2, 2), false);
  EXPECT_EQ(read_idx_images(dir.file("a.gz")).content_hash, read_idx_images(dir.file("a")).content_hash);
  EXPECT_NE(read_idx_images(dir.file("a")).content_hash, read_idx_images(dir.file("b")).content_hash);
}

TEST(Idx, CompressionIsDetectedByMagicBytesNotByName) {
  TempDir dir;
  const IdxImages images = make_images(2, 2, 2);
  write_idx_images(dir.file("compressed.idx"), images, true);
  write_idx_images(dir.file("plain.gz"), images, false);
  EXPECT_EQ(read_idx_images(dir.file("compressed.idx")).pixels, images.pixels);
  EXPECT_EQ(read_idx_images(dir.file("plain.gz")).pixels, images.pixels);
}

TEST(Idx, ConcatenatedGzipMembersReadAsOneStream) {
  TempDir dir;
  const std::vector<uint8_t> bytes = {0, 0, 8, 1, 0, 0, 0, 4, 1, 2, 3, 4};
  write_gzip_members(dir.file("labels.gz"),
                     {{bytes.begin(), bytes.begin() + 6}, {bytes.begin() + 6, bytes.end()}});
  EXPECT_EQ(read_idx_labels(dir.file("labels.gz"), 10).labels, (std::vector<uint8_t>{1, 2, 3, 4}));
}

TEST(Idx, TrailingBytesAreIgnored) {
  TempDir dir;
  const IdxImages images = make_images(3, 2, 2);
  write_idx_images(dir.file("raw"), images, false);
  write_idx_images(dir.file("gz"), images, true);
  for (const char* name : {"raw", "gz"}) {
    std::vector<uint8_t> bytes = read_bytes(dir.file(name));
    bytes.insert(bytes.end(), {0xde, 0xad, 0xbe, 0xef, 0x00});
    write_bytes(dir.file(name), bytes);
    EXPECT_EQ(read_idx_images(dir.file(name)).pixels, images.pixels) << name;
  }
}

TEST(Idx, TruncatedPayloadNamesFileAndSizes) {
  TempDir dir;
  const std::string path = dir.file("train-images-idx3-ubyte");
  write_idx_images(path, make_images(5, 3, 4), false);
  std::filesystem::resize_file(path, 16 + 10);
  const std::string message = error_of([&] { read_idx_images(path); });
  EXPECT_NE(
      message.find(path + ": truncated: header says 5 images of 3x4 (60 bytes) but the file holds 10 bytes"),
      std::string::npos)
      << message;
}

TEST(Idx, TruncatedHeaderNamesFile) {
  TempDir dir;
  const std::string path = dir.file("labels");
  write_bytes(path, {0, 0, 8, 1, 0, 0});
  const std::string message = error_of([&] { read_idx_labels(path, 10); });
  EXPECT_NE(message.find(path + ": truncated: the file ends inside the 8-byte IDX header"), std::string::npos)
      << message;
}

TEST(Idx, TruncatedGzipNamesFileAndSaysTruncated) {
  TempDir dir;
  const std::string path = dir.file("train-images-idx3-ubyte.gz");
  write_idx_images(path, make_images(200, 28, 28), true);  // random pixels: barely compressible
  std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
  const std::string message = error_of([&] { read_idx_images(path); });
  EXPECT_EQ(message.rfind(path + ": truncated: header says 200 images of 28x28 (156800 bytes)", 0), 0u)
      << message;
  EXPECT_NE(message.find("gzip stream is cut short"), std::string::npos) << message;
}

TEST(Idx, GzipWithoutItsTrailerIsTruncated) {
  TempDir dir;
  const std::string path = dir.file("labels.gz");
  write_idx_labels(path, {1, 2, 3}, true);
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 8);  // drop CRC-32 and length
  const std::string message = error_of([&] { read_idx_labels(path, 10); });
  EXPECT_EQ(message.rfind(path + ": truncated gzip stream", 0), 0u) << message;
}

TEST(Idx, BadMagicNamesFileAndBothMagics) {
  TempDir dir;
  const std::string path = dir.file("swapped");
  write_idx_labels(path, {1, 2, 3}, true);
  const std::string message = error_of([&] { read_idx_images(path); });
  EXPECT_EQ(message,
            path + ": bad magic 0x00000801 (IDX uint8 labels): expected 0x00000803 (IDX uint8 images)");

  write_bytes(path, {'<', 'h', 't', 'm', 'l', '>', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
  EXPECT_NE(error_of([&] { read_idx_images(path); }).find("bad magic 0x3c68746d (not an IDX file)"),
            std::string::npos);
}

TEST(Idx, CorruptGzipStreamNamesFileAndProblem) {
  TempDir dir;
  const std::string path = dir.file("images.gz");
  // A valid gzip header followed by a deflate block of the reserved type 3.
  write_bytes(path, {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 0xff, 0xff, 0xff, 0xff});
  EXPECT_EQ(error_of([&] { read_idx_images(path); }), path + ": corrupt gzip stream: invalid block type");
}

TEST(Idx, GzipWithWrongChecksumIsCorrupt) {
  TempDir dir;
  const std::string path = dir.file("labels.gz");
  write_idx_labels(path, {1, 2, 3}, true);
  std::vector<uint8_t> bytes = read_bytes(path);
  bytes[bytes.size() - 8] ^= 0xff;  // first byte of the CRC-32
  write_bytes(path, bytes);
  EXPECT_EQ(error_of([&] { read_idx_labels(path, 10); }),
            path + ": corrupt gzip stream: incorrect data check");
}

TEST(Idx, LabelOutOfRangeNamesFileAndFirstBadIndex) {
  TempDir dir;
  const std::string path = dir.file("labels");
  write_idx_labels(path, {0, 3, 12, 1, 15}, false);
  EXPECT_EQ(error_of([&] { read_idx_labels(path, 10); }), path + ": label 12 at index 2 is outside [0, 10)");
}

TEST(Idx, ZeroSizedImagesAreRejected) {
  TempDir dir;
  const std::string path = dir.file("images");
  write_bytes(path, {0, 0, 8, 3, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 28});
  EXPECT_NE(error_of([&] { read_idx_images(path); }).find(path + ": bad dimensions: 1 images of 0x28"),
            std::string::npos);
}

TEST(Idx, HugeHeaderOnSmallFileIsTruncatedNotAnAllocation) {
  TempDir dir;
  const std::string path = dir.file("images");
  write_bytes(path, {0, 0, 8, 3, 0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 16, 0, 0, 0, 16, 1, 2});
  const std::string message = error_of([&] { read_idx_images(path); });
  EXPECT_NE(message.find("truncated: header says 2147483647 images of 16x16"), std::string::npos) << message;
  EXPECT_NE(message.find("holds 2 bytes"), std::string::npos) << message;

  write_bytes(path, {0, 0, 8, 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff});
  EXPECT_NE(error_of([&] { read_idx_images(path); }).find("bad dimensions: 4294967295 images of"),
            std::string::npos);
}

TEST(Idx, MissingFileNamesPath) {
  const std::string path = "/nonexistent/train-images-idx3-ubyte.gz";
  EXPECT_EQ(error_of([&] { read_idx_images(path); }), path + ": cannot open: No such file or directory");
}

}  // namespace
}  // namespace trainer
