#include "data/cifar.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/data_error.h"
#include "data/error_of.h"
#include "data/temp_dir.h"

namespace trainer {
namespace {

using testing::error_of;
using testing::TempDir;
using testing::write_bytes;

// The pixel (channel c, row y, column x) of record r of file f, distinct enough to catch a layout mix-up.
uint8_t pixel(int f, int r, int c, int y, int x) {
  return static_cast<uint8_t>(c * 71 + y * 5 + x * 3 + f * 11 + r);
}

// A record as the binary version stores it: label byte(s), then 3072 bytes channel by channel.
void append_record(std::vector<uint8_t>& bytes, std::vector<uint8_t> labels, int f, int r) {
  bytes.insert(bytes.end(), labels.begin(), labels.end());
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 32; ++y)
      for (int x = 0; x < 32; ++x) bytes.push_back(pixel(f, r, c, y, x));
}

// CIFAR-10 lookalike: data_batch_1..5 with 2 records each (3 in the last) and a 2-record test_batch.
// The label of record r of file f is (f + 3 * r) % 10.
void write_cifar10(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  for (int f = 0; f < 6; ++f) {
    std::vector<uint8_t> bytes;
    const int records = f == 4 ? 3 : 2;
    for (int r = 0; r < records; ++r) append_record(bytes, {static_cast<uint8_t>((f + 3 * r) % 10)}, f, r);
    write_bytes((dir / (f < 5 ? "data_batch_" + std::to_string(f + 1) + ".bin" : "test_batch.bin")).string(),
                bytes);
  }
}

void expect_sample(const Cifar& dataset, int64_t index, int f, int r) {
  std::vector<uint8_t> hwc(3072);
  dataset.read_into(index, hwc.data());
  for (int y = 0; y < 32; ++y)
    for (int x = 0; x < 32; ++x)
      for (int c = 0; c < 3; ++c)
        ASSERT_EQ(hwc[static_cast<size_t>((y * 32 + x) * 3 + c)], pixel(f, r, c, y, x))
            << "index " << index << " y " << y << " x " << x << " c " << c;
}

TEST(Cifar10, LoadsBatchesInOrderAsHwcWithLabels) {
  TempDir dir;
  write_cifar10(dir.path());
  const Cifar train(CifarVariant::cifar10, dir.path().string(), "train");
  EXPECT_EQ(train.name(), "cifar10/train");
  EXPECT_EQ(train.size(), 11);
  EXPECT_EQ(train.channels(), 3);
  EXPECT_EQ(train.height(), 32);
  EXPECT_EQ(train.num_classes(), 10);
  EXPECT_EQ(train.class_names()[0], "airplane");
  EXPECT_EQ(train.files().size(), 5u);
  int64_t index = 0;
  for (int f = 0; f < 5; ++f) {
    for (int r = 0; r < (f == 4 ? 3 : 2); ++r, ++index) {
      EXPECT_EQ(train.label(index), (f + 3 * r) % 10);
      expect_sample(train, index, f, r);
    }
  }
  const Cifar test(CifarVariant::cifar10, dir.path().string(), "test");
  EXPECT_EQ(test.size(), 2);
  EXPECT_EQ(test.label(1), (5 + 3) % 10);
  expect_sample(test, 1, 5, 1);
  const Normalization n = train.normalization();
  EXPECT_EQ(n.mean, (std::vector<float>{0.4914f, 0.4822f, 0.4465f}));
  EXPECT_EQ(n.std, (std::vector<float>{0.2470f, 0.2435f, 0.2616f}));
  EXPECT_EQ(train.fingerprint().rfind("cifar10/train size=11 hwc=32x32x3 classes=[airplane,automobile,", 0),
            0u)
      << train.fingerprint();
}

TEST(Cifar10, AcceptsTheDirectoryHoldingTheExtractedOneAndReadsClassNames) {
  TempDir dir;
  const auto batches = dir.path() / "cifar-10-batches-bin";
  write_cifar10(batches);
  std::ofstream(batches / "batches.meta.txt") << "a0\na1\na2\na3\na4\na5\na6\na7\na8\na9\n\n";
  const Cifar train(CifarVariant::cifar10, dir.path().string());
  EXPECT_EQ(train.directory(), batches.string());
  EXPECT_EQ(train.class_names()[9], "a9");
  std::ofstream(batches / "batches.meta.txt") << "only\nthree\nnames\n";
  const std::string error = error_of([&] { Cifar(CifarVariant::cifar10, batches.string()); });
  EXPECT_NE(error.find((batches / "batches.meta.txt").string() + ": holds 3 class names, expected 10"),
            std::string::npos)
      << error;
}

TEST(Cifar10, FingerprintFollowsTheBytes) {
  TempDir dir;
  const auto a = dir.path() / "a", b = dir.path() / "b";
  write_cifar10(a);
  write_cifar10(b);
  EXPECT_EQ(Cifar(CifarVariant::cifar10, a.string()).fingerprint(),
            Cifar(CifarVariant::cifar10, b.string()).fingerprint());
  std::vector<uint8_t> bytes = testing::read_bytes((b / "data_batch_3.bin").string());
  bytes[100] ^= 1;
  write_bytes((b / "data_batch_3.bin").string(), bytes);
  EXPECT_NE(Cifar(CifarVariant::cifar10, a.string()).fingerprint(),
            Cifar(CifarVariant::cifar10, b.string()).fingerprint());
}

TEST(Cifar10, WrongSizesAndLabelsAreRefusedNamingTheFile) {
  TempDir dir;
  write_cifar10(dir.path());
  const std::string path = (dir.path() / "data_batch_2.bin").string();
  std::vector<uint8_t> bytes = testing::read_bytes(path);
  bytes.resize(2 * 3073 - 5);  // cut inside the second record
  write_bytes(path, bytes);
  std::string error = error_of([&] { Cifar(CifarVariant::cifar10, dir.path().string()); });
  EXPECT_NE(error.find(path + ": 6141 bytes is not a whole number of 3073-byte cifar10 records"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("HINT"), std::string::npos) << error;
  // The test split does not read the broken training file.
  EXPECT_EQ(Cifar(CifarVariant::cifar10, dir.path().string(), "test").size(), 2);

  write_bytes(path, {});
  error = error_of([&] { Cifar(CifarVariant::cifar10, dir.path().string()); });
  EXPECT_NE(error.find(path + ": 0 bytes"), std::string::npos) << error;

  bytes.resize(2 * 3073);
  bytes[3073] = 10;  // record 1's label
  write_bytes(path, bytes);
  error = error_of([&] { Cifar(CifarVariant::cifar10, dir.path().string()); });
  EXPECT_NE(error.find(path + ": record 1 has label 10, outside [0, 10)"), std::string::npos) << error;
}

TEST(Cifar10, MissingFilesNameThePathAndWhereToGetTheBinaryVersion) {
  TempDir dir;
  write_cifar10(dir.path());
  std::filesystem::remove(dir.path() / "data_batch_4.bin");
  std::string error = error_of([&] { Cifar(CifarVariant::cifar10, dir.path().string()); });
  EXPECT_NE(error.find((dir.path() / "data_batch_4.bin").string() + ": no such file"), std::string::npos)
      << error;
  EXPECT_NE(error.find("HINT: download the binary version (cifar-10-binary.tar.gz"), std::string::npos)
      << error;
  error = error_of([&] { Cifar(CifarVariant::cifar10, (dir.path() / "nope").string()); });
  EXPECT_NE(error.find("nope: no such directory"), std::string::npos) << error;
  EXPECT_NE(error.find("https://www.cs.toronto.edu/~kriz/cifar.html"), std::string::npos) << error;
  EXPECT_NE(
      error_of([&] { Cifar(CifarVariant::cifar10, dir.path().string(), "val"); }).find("unknown split 'val'"),
      std::string::npos);
}

TEST(Cifar100, UsesTheFineLabelAndKeepsTheCoarseOne) {
  TempDir dir;
  const auto root = dir.path() / "cifar-100-binary";
  std::filesystem::create_directories(root);
  std::vector<uint8_t> train, test;
  for (int r = 0; r < 3; ++r)
    append_record(train, {static_cast<uint8_t>(r + 17), static_cast<uint8_t>(97 - r)}, 0, r);
  append_record(test, {19, 42}, 1, 0);
  write_bytes((root / "train.bin").string(), train);
  write_bytes((root / "test.bin").string(), test);
  const Cifar dataset(CifarVariant::cifar100, root.string(), "train");
  EXPECT_EQ(dataset.name(), "cifar100/train");
  EXPECT_EQ(dataset.size(), 3);
  EXPECT_EQ(dataset.num_classes(), 100);
  EXPECT_EQ(Cifar::kCifar100ClassNames.size(), 100u);
  EXPECT_EQ(dataset.class_names()[97], "wolf");
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(dataset.label(r), 97 - r);
    EXPECT_EQ(dataset.coarse_labels()[static_cast<size_t>(r)], r + 17);
    expect_sample(dataset, r, 0, r);
  }
  EXPECT_EQ(dataset.normalization().mean, (std::vector<float>{0.5071f, 0.4865f, 0.4409f}));
  EXPECT_EQ(dataset.normalization().std, (std::vector<float>{0.2673f, 0.2564f, 0.2762f}));
  const Cifar test_split(CifarVariant::cifar100, dir.path().string(), "test");
  EXPECT_EQ(test_split.label(0), 42);

  // A CIFAR-10 batch is not a whole number of 3074-byte CIFAR-100 records.
  std::vector<uint8_t> ten;
  for (int r = 0; r < 2; ++r) append_record(ten, {1}, 0, r);
  write_bytes((root / "train.bin").string(), ten);
  const std::string error = error_of([&] { Cifar(CifarVariant::cifar100, root.string()); });
  EXPECT_NE(
      error.find((root / "train.bin").string() + ": 6146 bytes is not a whole number of 3074-byte cifar100 "
                                                 "records (2 label bytes + 3072 pixel bytes)"),
      std::string::npos)
      << error;
  EXPECT_NE(error.find("cifar-100-binary.tar.gz"), std::string::npos) << error;
}

}  // namespace
}  // namespace trainer
