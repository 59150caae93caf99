#include "data/image_folder.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "data/data_error.h"
#include "data/error_of.h"
#include "data/image_codec.h"
#include "data/loader.h"
#include "data/temp_dir.h"
#include "nn/random.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::TempDir;
using testing::write_bytes;

std::vector<uint8_t> solid(int64_t width, int64_t height, const std::vector<uint8_t>& color) {
  std::vector<uint8_t> pixels;
  for (int64_t p = 0; p < width * height; ++p) pixels.insert(pixels.end(), color.begin(), color.end());
  return pixels;
}

// An image with some structure, so that crops and flips change it.
std::vector<uint8_t> pattern(int64_t width, int64_t height, int64_t channels) {
  std::vector<uint8_t> pixels(static_cast<size_t>(width * height * channels));
  for (int64_t y = 0; y < height; ++y)
    for (int64_t x = 0; x < width; ++x)
      for (int64_t c = 0; c < channels; ++c)
        pixels[static_cast<size_t>((y * width + x) * channels + c)] =
            static_cast<uint8_t>((x * 7 + y * 13 + c * 50) % 256);
  return pixels;
}

// Noise: JPEG cannot compress it much, so cutting a file in half cuts its entropy-coded data.
std::vector<uint8_t> noise(int64_t width, int64_t height, int64_t channels) {
  std::vector<uint8_t> pixels(static_cast<size_t>(width * height * channels));
  uint64_t state = 1;
  for (uint8_t& p : pixels) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    p = static_cast<uint8_t>(state >> 56);
  }
  return pixels;
}

void write_png(const fs::path& path, int64_t width, int64_t height, const std::vector<uint8_t>& color) {
  fs::create_directories(path.parent_path());
  const int64_t channels = static_cast<int64_t>(color.size());
  write_bytes(path.string(), encode_png(solid(width, height, color).data(), width, height, channels));
}

void write_jpeg(const fs::path& path, int64_t width, int64_t height, const std::vector<uint8_t>& color) {
  fs::create_directories(path.parent_path());
  const int64_t channels = static_cast<int64_t>(color.size());
  write_bytes(path.string(), encode_jpeg(solid(width, height, color).data(), width, height, channels, 100));
}

// cat/ and dog/ and ant/, mixed formats, sizes and channel counts, plus files that are not samples.
void write_tree(const fs::path& root) {
  write_jpeg(root / "cat" / "b.jpg", 40, 30, {200, 30, 60});
  write_png(root / "cat" / "a.png", 17, 33, {77});                     // grey
  write_jpeg(root / "cat" / "sub" / "c.JPEG", 64, 64, {10, 250, 10});  // in a sub-directory, upper case
  write_png(root / "dog" / "x.PNG", 20, 20, {10, 200, 30, 128});       // RGBA
  write_jpeg(root / "dog" / "y.jpeg", 50, 20, {90});                   // grey JPEG
  write_png(root / "ant" / "z.png", 300, 200, {1, 2, 3});
  std::ofstream(root / "cat" / "notes.txt") << "not an image";
  std::ofstream(root / "README") << "not a class";
}

std::vector<uint8_t> read(const Dataset& dataset, int64_t index) {
  std::vector<uint8_t> pixels(static_cast<size_t>(dataset.sample_bytes()));
  dataset.read_into(index, pixels.data());
  return pixels;
}

// Every pixel equals `color` within `tolerance` (JPEG's rounding).
void expect_solid(const std::vector<uint8_t>& pixels, const std::vector<uint8_t>& color, int tolerance,
                  const std::string& what) {
  for (size_t i = 0; i < pixels.size(); ++i) {
    ASSERT_NEAR(pixels[i], color[i % color.size()], tolerance) << what << " byte " << i;
  }
}

TEST(ImageFolder, ClassesAreSortedDirectoriesAndFilesFollowTorchvisionOrder) {
  TempDir dir;
  write_tree(dir.path());
  ImageFolderOptions options;
  options.image_size = 16;
  const ImageFolder dataset(dir.path().string(), options);
  EXPECT_EQ(dataset.class_names(), (std::vector<std::string>{"ant", "cat", "dog"}));
  ASSERT_EQ(dataset.size(), 6);
  const std::vector<std::string> files = {"ant/z.png",      "cat/a.png", "cat/b.jpg",
                                          "cat/sub/c.JPEG", "dog/x.PNG", "dog/y.jpeg"};
  const std::vector<int64_t> labels = {0, 1, 1, 1, 2, 2};
  for (int64_t i = 0; i < 6; ++i) {
    EXPECT_EQ(dataset.relative_path(i), files[static_cast<size_t>(i)]);
    EXPECT_EQ(dataset.label(i), labels[static_cast<size_t>(i)]);
  }
  EXPECT_EQ(dataset.path(0), dir.path().string() + "/ant/z.png");
  EXPECT_EQ(dataset.channels(), 3);
  EXPECT_EQ(dataset.height(), 16);
  EXPECT_EQ(dataset.width(), 16);
  EXPECT_EQ(dataset.num_classes(), 3);
  EXPECT_EQ(dataset.name(), "image_folder/" + dir.path().filename().string());
  EXPECT_EQ(dataset.normalization().mean, (std::vector<float>{0.485f, 0.456f, 0.406f}));
}

TEST(ImageFolder, EveryImageComesOutAtImageSizeInTheConfiguredChannels) {
  TempDir dir;
  write_tree(dir.path());
  for (const bool train : {false, true}) {
    ImageFolderOptions options;
    options.image_size = 16;
    options.train = train;
    const ImageFolder rgb(dir.path().string(), options);
    ASSERT_EQ(rgb.sample_bytes(), 16 * 16 * 3);
    for (int64_t i = 0; i < rgb.size(); ++i) {
      std::vector<uint8_t> pixels(static_cast<size_t>(rgb.sample_bytes()));
      Generator gen(static_cast<uint64_t>(i));
      EXPECT_EQ(rgb.read_augmented(i, pixels.data(), gen), rgb.label(i));
      // Solid images stay solid whatever the crop: check the colour conversions.
      const std::vector<std::vector<uint8_t>> colours = {{1, 2, 3},     {77, 77, 77},  {200, 30, 60},
                                                         {10, 250, 10}, {10, 200, 30}, {90, 90, 90}};
      expect_solid(pixels, colours[static_cast<size_t>(i)], 3, rgb.relative_path(i));
    }
    options.channels = 1;
    const ImageFolder grey(dir.path().string(), options);
    ASSERT_EQ(grey.sample_bytes(), 16 * 16);
    EXPECT_EQ(grey.normalization().mean.size(), 1u);
    expect_solid(read(grey, 1), {77}, 0, "grey png");
    expect_solid(read(grey, 4), {(10 * 19595 + 200 * 38470 + 30 * 7471 + 0x8000) >> 16}, 0,
                 "rgba png to grey");
    expect_solid(read(grey, 5), {90}, 1, "grey jpeg");
  }
}

TEST(ImageFolder, EvaluationViewIsResizeThenCenterCrop) {
  TempDir dir;
  // 18 x 9 for image_size 8: Resize(8 * 256 / 224 = 9) leaves it as it is, CenterCrop(8) takes rows
  // 0..7 (Python rounds 0.5 to 0) and columns 5..12.
  const std::vector<uint8_t> image = pattern(18, 9, 3);
  fs::create_directories(dir.path() / "only");
  write_bytes((dir.path() / "only" / "p.png").string(), encode_png(image.data(), 18, 9, 3));
  ImageFolderOptions options;
  options.image_size = 8;
  const ImageFolder dataset(dir.path().string(), options);
  const std::vector<uint8_t> pixels = read(dataset, 0);
  for (int y = 0; y < 8; ++y)
    for (int x = 0; x < 8; ++x)
      for (int c = 0; c < 3; ++c)
        ASSERT_EQ(pixels[static_cast<size_t>((y * 8 + x) * 3 + c)],
                  image[static_cast<size_t>((y * 18 + x + 5) * 3 + c)]);
  // In evaluation mode read_augmented ignores the generator.
  std::vector<uint8_t> again(pixels.size());
  Generator gen(3);
  dataset.read_augmented(0, again.data(), gen);
  EXPECT_EQ(again, pixels);
}

TEST(ImageFolder, TrainingCropsDependOnTheGeneratorOnly) {
  TempDir dir;
  const std::vector<uint8_t> image = pattern(120, 90, 3);
  fs::create_directories(dir.path() / "c");
  write_bytes((dir.path() / "c" / "p.jpg").string(), encode_jpeg(image.data(), 120, 90, 3));
  ImageFolderOptions options;
  options.image_size = 24;
  options.train = true;
  const ImageFolder dataset(dir.path().string(), options);
  std::vector<uint8_t> a(24 * 24 * 3), b(a.size()), c(a.size());
  Generator g1(7), g2(7), g3(8);
  dataset.read_augmented(0, a.data(), g1);
  dataset.read_augmented(0, b.data(), g2);
  dataset.read_augmented(0, c.data(), g3);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_EQ(g1.next_u64(), g2.next_u64());  // the same draws were taken
}

// The fingerprint hashes names, sizes and the contents of a sample of the files (all 6 here).
TEST(ImageFolder, FingerprintHashesNamesSizesAndSampledContents) {
  TempDir dir;
  const fs::path a = dir.path() / "a", b = dir.path() / "b";
  write_tree(a);
  write_tree(b);
  const auto fingerprint = [](const fs::path& root) { return ImageFolder(root.string()).fingerprint(); };
  // Directories named differently: compare from the classes on.
  const auto hash = [&](const fs::path& root) {
    const std::string f = fingerprint(root);
    return f.substr(f.find("classes="));
  };
  EXPECT_EQ(hash(a), hash(b));
  EXPECT_EQ(fingerprint(a).rfind("image_folder/a size=6 hwc=224x224x3 classes=[ant,cat,dog] hash=", 0), 0u)
      << fingerprint(a);
  write_png(b / "ant" / "z.png", 301, 200, {1, 2, 3});  // another size
  EXPECT_NE(hash(a), hash(b));
  write_png(b / "ant" / "z.png", 300, 200, {1, 2, 3});
  EXPECT_EQ(hash(a), hash(b));
  fs::rename(b / "ant" / "z.png", b / "ant" / "y.png");  // another name
  EXPECT_NE(hash(a), hash(b));
  fs::rename(b / "ant" / "y.png", b / "ant" / "z.png");
  EXPECT_EQ(hash(a), hash(b));
  {  // the same name and size, one byte different
    std::fstream f(b / "ant" / "z.png", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(40);
    const char c = static_cast<char>(f.get() ^ 0x5a);
    f.seekp(40);
    f.put(c);
  }
  EXPECT_EQ(fs::file_size(a / "ant" / "z.png"), fs::file_size(b / "ant" / "z.png"));
  EXPECT_NE(hash(a), hash(b));
}

TEST(ImageFolder, EvaluationSplitTakesTheTrainingClassList) {
  TempDir dir;
  write_png(dir.path() / "b" / "1.png", 4, 4, {1});
  ImageFolderOptions options;
  options.classes = {"a", "b", "c"};
  const ImageFolder val(dir.path().string(), options);
  EXPECT_EQ(val.num_classes(), 3);
  EXPECT_EQ(val.label(0), 1);
  write_png(dir.path() / "d" / "1.png", 4, 4, {1});
  const std::string error = error_of([&] { ImageFolder(dir.path().string(), options); });
  EXPECT_NE(
      error.find((dir.path() / "d").string() + ": class directory 'd' is not one of the 3 training classes"),
      std::string::npos)
      << error;
}

TEST(ImageFolder, LayoutErrorsNameTheDirectory) {
  TempDir dir;
  std::string error = error_of([&] { ImageFolder((dir.path() / "missing").string()); });
  EXPECT_NE(error.find("missing: no such directory"), std::string::npos) << error;
  error = error_of([&] { ImageFolder(dir.path().string()); });
  EXPECT_NE(error.find(dir.path().string() + ": no class sub-directories. HINT"), std::string::npos) << error;
  fs::create_directories(dir.path() / "empty");
  std::ofstream(dir.path() / "empty" / "x.txt") << "x";
  error = error_of([&] { ImageFolder(dir.path().string()); });
  EXPECT_NE(error.find((dir.path() / "empty").string() + ": no .jpg, .jpeg or .png files"), std::string::npos)
      << error;
  write_png(dir.path() / "empty" / "1.png", 4, 4, {1});
  ImageFolderOptions options;
  options.channels = 4;
  EXPECT_NE(error_of([&] { ImageFolder(dir.path().string(), options); }).find("1 (grey) or 3 (RGB)"),
            std::string::npos);
}

// ---- bad files

struct BadTree {
  // Index -> what read_into must say about it; empty for good files.
  std::vector<std::string> problems;
};

// Class "a": good, truncated JPEG, 10-byte file, PNG named .jpg (good), not an image, deleted; class
// "b": good. The last bad file of "a" is followed by b's first file, so replacing it changes the label.
BadTree write_bad_tree(const fs::path& root) {
  const std::vector<uint8_t> image = noise(48, 32, 3);
  const std::vector<uint8_t> jpeg = encode_jpeg(image.data(), 48, 32, 3);
  fs::create_directories(root / "a");
  write_bytes((root / "a" / "0_good.jpg").string(), jpeg);
  write_bytes((root / "a" / "1_truncated.jpg").string(),
              {jpeg.begin(), jpeg.begin() + static_cast<long>(jpeg.size() / 2)});
  write_bytes((root / "a" / "2_ten_bytes.jpg").string(), {jpeg.begin(), jpeg.begin() + 10});
  write_bytes((root / "a" / "3_png_named.jpg").string(), encode_png(image.data(), 48, 32, 3));
  std::ofstream(root / "a" / "4_text.jpg") << "<html>this is not an image</html>";
  write_bytes((root / "a" / "5_deleted.png").string(), jpeg);  // removed once the file list is taken
  write_png(root / "b" / "0_good.png", 30, 30, {5, 6, 7});
  return {{"", "truncated JPEG", "truncated or corrupt JPEG header", "", "not a JPEG or PNG image",
           "cannot open: No such file"}};
}

TEST(ImageFolderBadFiles, ErrorModeNamesTheFileAndTheProblem) {
  TempDir dir;
  const BadTree tree = write_bad_tree(dir.path());
  for (const bool train : {false, true}) {
    ImageFolderOptions options;
    options.image_size = 16;
    options.train = train;
    const ImageFolder dataset(dir.path().string(), options);
    fs::remove(dir.path() / "a" / "5_deleted.png");
    ASSERT_EQ(dataset.size(), 7);
    for (int64_t i = 0; i < dataset.size(); ++i) {
      const std::string expected = i < 6 ? tree.problems[static_cast<size_t>(i)] : "";
      std::vector<uint8_t> pixels(static_cast<size_t>(dataset.sample_bytes()));
      Generator gen(1);
      const std::string augmented = error_of([&] { dataset.read_augmented(i, pixels.data(), gen); });
      const std::string strict = error_of([&] { dataset.read_into(i, pixels.data()); });
      if (expected.empty()) {
        EXPECT_EQ(augmented, "") << i;
        EXPECT_EQ(strict, "") << i;
        continue;
      }
      EXPECT_EQ(augmented.rfind(dataset.path(i) + ": " + expected, 0), 0u) << augmented;
      EXPECT_NE(augmented.find("HINT"), std::string::npos) << augmented;
      EXPECT_EQ(strict, augmented);
    }
    EXPECT_EQ(dataset.skipped_samples(), 0);
    write_bytes((dir.path() / "a" / "5_deleted.png").string(), {1});
  }
}

TEST(ImageFolderBadFiles, UnreadableFileIsBad) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads files whatever their permissions";
  TempDir dir;
  write_png(dir.path() / "a" / "locked.png", 4, 4, {1});
  fs::permissions(dir.path() / "a" / "locked.png", fs::perms::none);
  const ImageFolder dataset(dir.path().string());
  std::vector<uint8_t> pixels(static_cast<size_t>(dataset.sample_bytes()));
  const std::string error = error_of([&] { dataset.read_into(0, pixels.data()); });
  EXPECT_NE(error.find("locked.png: cannot open: Permission denied"), std::string::npos) << error;
  fs::permissions(dir.path() / "a" / "locked.png", fs::perms::owner_all);
}

// A file that cannot be opened while the list is taken (a dangling link here; a file of mode 000 for a
// user other than root) used to crash the content fingerprint (issue 30): it is a bad sample like any
// other, an error naming it or, with "skip", replaced and counted.
TEST(ImageFolderBadFiles, AFileThatCannotBeOpenedWhenListedIsABadSample) {
  TempDir dir;
  fs::create_directories(dir.path() / "a");
  fs::create_symlink(dir.path() / "nowhere.png", dir.path() / "a" / "0_dangling.png");
  write_png(dir.path() / "a" / "1_good.png", 8, 8, {1, 2, 3});
  ImageFolderOptions options;
  options.image_size = 8;
  const ImageFolder strict(dir.path().string(), options);
  ASSERT_EQ(strict.size(), 2);
  std::vector<uint8_t> pixels(static_cast<size_t>(strict.sample_bytes()));
  Generator gen(0);
  const std::string error = error_of([&] { strict.read_augmented(0, pixels.data(), gen); });
  EXPECT_EQ(error.rfind(strict.path(0) + ": cannot open: No such file or directory", 0), 0u) << error;

  options.bad_samples = BadSamplePolicy::skip;
  options.warn = [](const std::string&) {};
  const ImageFolder skipping(dir.path().string(), options);
  EXPECT_EQ(skipping.fingerprint(), strict.fingerprint());
  EXPECT_EQ(skipping.read_augmented(0, pixels.data(), gen), skipping.label(1));
  EXPECT_EQ(skipping.skipped_samples(), 1);
  EXPECT_EQ(skipping.bad_files(), 1);
}

TEST(ImageFolderBadFiles, SkipModeReplacesWithTheNextGoodSampleCountsAndWarnsOnce) {
  TempDir dir;
  write_bad_tree(dir.path());
  std::mutex mutex;
  std::vector<std::string> warnings;
  ImageFolderOptions options;
  options.image_size = 16;
  options.bad_samples = BadSamplePolicy::skip;
  options.warn = [&](const std::string& message) {
    std::lock_guard lock(mutex);
    warnings.push_back(message);
  };
  const auto dataset = std::make_shared<ImageFolder>(dir.path().string(), options);
  fs::remove(dir.path() / "a" / "5_deleted.png");
  // 1 and 2 become 3 (the PNG named .jpg, label 0); 4 and 5 become b's image (label 1).
  const std::vector<int64_t> replacement = {0, 3, 3, 3, 6, 6, 6};
  std::vector<int64_t> indices = {0, 1, 2, 3, 4, 5, 6};
  for (int pass = 1; pass <= 2; ++pass) {
    LoaderOptions loader_options;
    loader_options.batch_size = 7;
    loader_options.num_workers = pass == 1 ? 3 : 0;
    DataLoader loader(dataset, indices, loader_options);
    const std::optional<Batch> batch = loader.next();
    ASSERT_TRUE(batch.has_value());
    const std::vector<uint8_t> pixels = batch->images.to_vector<uint8_t>();
    const std::vector<int64_t> labels = batch->labels.to_vector<int64_t>();
    for (size_t i = 0; i < 7; ++i) {
      const int64_t source = replacement[i];
      EXPECT_EQ(labels[i], dataset->label(source)) << i;
      const std::vector<uint8_t> expected = read(*dataset, source);
      EXPECT_TRUE(std::equal(expected.begin(), expected.end(),
                             pixels.begin() + static_cast<long>(i * expected.size())))
          << i;
    }
    EXPECT_EQ(dataset->skipped_samples(), 4 * pass);  // every replacement counts
    EXPECT_EQ(dataset->bad_files(), 4);
  }
  ASSERT_EQ(warnings.size(), 4u);  // once per bad file
  std::set<std::string> named;
  for (const std::string& warning : warnings) {
    EXPECT_NE(warning.find("data.bad_samples = \"skip\""), std::string::npos) << warning;
    for (const char* file : {"1_truncated.jpg", "2_ten_bytes.jpg", "4_text.jpg", "5_deleted.png"})
      if (warning.find(file) != std::string::npos) named.insert(file);
  }
  EXPECT_EQ(named.size(), 4u);
}

// Evaluation counts every readable image exactly once (issue 30): with "skip", an unreadable one is left
// out of its batch, not replaced by a neighbour that would then count twice; the loader counts it.
TEST(ImageFolderBadFiles, EvaluationWithSkipLeavesBadSamplesOutInsteadOfReplacingThem) {
  TempDir dir;
  write_bad_tree(dir.path());
  std::vector<std::string> warnings;
  std::mutex mutex;
  ImageFolderOptions options;
  options.image_size = 16;
  options.train = false;
  options.bad_samples = BadSamplePolicy::skip;
  options.drop_bad_samples = true;  // what the evaluation split gets (app/run/datasets.cpp)
  options.warn = [&](const std::string& message) {
    std::lock_guard lock(mutex);
    warnings.push_back(message);
  };
  const auto dataset = std::make_shared<ImageFolder>(dir.path().string(), options);
  fs::remove(dir.path() / "a" / "5_deleted.png");
  const std::vector<int64_t> good = {0, 3, 6};
  for (const int workers : {0, 2}) {
    LoaderOptions loader_options;
    loader_options.batch_size = 2;  // batch {4, 5} has no readable image at all
    loader_options.num_workers = workers;
    DataLoader loader(dataset, {0, 1, 2, 3, 4, 5, 6}, loader_options);
    std::vector<int64_t> seen;
    while (std::optional<Batch> batch = loader.next()) {
      ASSERT_GT(batch->indices.size(), 0u);
      ASSERT_EQ(batch->images.shape()[0], static_cast<int64_t>(batch->indices.size()));
      const std::vector<uint8_t> pixels = batch->images.to_vector<uint8_t>();
      const std::vector<int64_t> labels = batch->labels.to_vector<int64_t>();
      ASSERT_EQ(labels.size(), batch->indices.size());
      for (size_t i = 0; i < batch->indices.size(); ++i) {
        const int64_t index = batch->indices[i];
        seen.push_back(index);
        EXPECT_EQ(labels[i], dataset->label(index)) << index;
        const std::vector<uint8_t> expected = read(*dataset, index);
        EXPECT_TRUE(std::equal(expected.begin(), expected.end(),
                               pixels.begin() + static_cast<long>(i * expected.size())))
            << index;
      }
    }
    EXPECT_EQ(seen, good) << workers << " workers";
    EXPECT_EQ(loader.dropped_samples(), 4) << workers << " workers";
  }
  EXPECT_EQ(dataset->skipped_samples(), 0);  // nothing was replaced
  EXPECT_EQ(dataset->bad_files(), 4);
  ASSERT_EQ(warnings.size(), 4u);
  EXPECT_NE(warnings[0].find("left out of the evaluation"), std::string::npos) << warnings[0];
}

TEST(ImageFolderBadFiles, SkipModeGivesTheSameTrainingBatchesWhateverTheWorkerCount) {
  TempDir dir;
  write_bad_tree(dir.path());
  ImageFolderOptions options;
  options.image_size = 12;
  options.train = true;
  options.bad_samples = BadSamplePolicy::skip;
  options.warn = [](const std::string&) {};
  std::vector<std::vector<uint8_t>> runs;
  for (const int workers : {0, 1, 3}) {
    // A fresh dataset each time: which bad files are already known must not matter either.
    const auto dataset = std::make_shared<ImageFolder>(dir.path().string(), options);
    LoaderOptions loader_options;
    loader_options.batch_size = 3;
    loader_options.num_workers = workers;
    loader_options.transforms.horizontal_flip = true;
    loader_options.seed = 9;
    DataLoader loader(dataset, {6, 5, 4, 3, 2, 1, 0, 1, 2}, loader_options);
    std::vector<uint8_t> all;
    while (std::optional<Batch> batch = loader.next()) {
      const std::vector<uint8_t> pixels = batch->images.to_vector<uint8_t>();
      all.insert(all.end(), pixels.begin(), pixels.end());
    }
    runs.push_back(all);
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[0], runs[2]);
}

TEST(ImageFolderBadFiles, SkipModeWithNothingGoodStops) {
  TempDir dir;
  fs::create_directories(dir.path() / "a");
  std::ofstream(dir.path() / "a" / "x.jpg") << "nope";
  ImageFolderOptions options;
  options.bad_samples = BadSamplePolicy::skip;
  options.warn = [](const std::string&) {};
  const ImageFolder dataset(dir.path().string(), options);
  std::vector<uint8_t> pixels(static_cast<size_t>(dataset.sample_bytes()));
  Generator gen(0);
  EXPECT_NE(error_of([&] {
              dataset.read_augmented(0, pixels.data(), gen);
            }).find("none of the 1 images can be decoded"),
            std::string::npos);
}

TEST(BadSamplePolicy, ParsesTheConfigValues) {
  EXPECT_EQ(parse_bad_sample_policy("error"), BadSamplePolicy::error);
  EXPECT_EQ(parse_bad_sample_policy("skip"), BadSamplePolicy::skip);
  EXPECT_STREQ(to_string(BadSamplePolicy::skip), "skip");
  EXPECT_THROW(parse_bad_sample_policy("ignore"), DataError);
}

// ---- with the loader

TEST(ImageFolderLoader, TrainingBatchesAreIdenticalWhateverTheWorkerCount) {
  TempDir dir;
  write_tree(dir.path());
  const std::vector<uint8_t> image = pattern(90, 70, 3);
  write_bytes((dir.path() / "ant" / "pattern.jpg").string(), encode_jpeg(image.data(), 90, 70, 3));
  write_bytes((dir.path() / "dog" / "pattern.png").string(), encode_png(image.data(), 90, 70, 3));
  ImageFolderOptions options;
  options.image_size = 20;
  options.train = true;
  const auto dataset = std::make_shared<ImageFolder>(dir.path().string(), options);
  ASSERT_EQ(dataset->size(), 8);
  std::vector<int64_t> indices;
  for (int repeat = 0; repeat < 3; ++repeat)
    for (int64_t i = 0; i < dataset->size(); ++i) indices.push_back((i * 5 + repeat) % dataset->size());
  std::vector<std::vector<Batch>> runs;
  for (const int workers : {0, 1, 4}) {
    LoaderOptions loader_options;
    loader_options.batch_size = 5;
    loader_options.num_workers = workers;
    loader_options.transforms.horizontal_flip = true;
    loader_options.seed = 3;
    loader_options.epoch = 2;
    DataLoader loader(dataset, indices, loader_options);
    std::vector<Batch> batches;
    while (std::optional<Batch> batch = loader.next()) batches.push_back(std::move(*batch));
    runs.push_back(std::move(batches));
  }
  ASSERT_EQ(runs[0].size(), 5u);
  EXPECT_EQ(runs[0][0].images.shape(), (Shape{5, 20, 20, 3}));
  for (size_t run = 1; run < runs.size(); ++run) {
    for (size_t b = 0; b < runs[0].size(); ++b) {
      EXPECT_EQ(runs[run][b].images.to_vector<uint8_t>(), runs[0][b].images.to_vector<uint8_t>());
      EXPECT_EQ(runs[run][b].labels.to_vector<int64_t>(), runs[0][b].labels.to_vector<int64_t>());
    }
  }
  // The same sample drawn twice in an epoch gets the same crop (seeded by index), another epoch another.
  LoaderOptions other_epoch;
  other_epoch.batch_size = 5;
  other_epoch.seed = 3;
  other_epoch.epoch = 3;
  DataLoader loader(dataset, indices, other_epoch);
  EXPECT_NE(loader.next()->images.to_vector<uint8_t>(), runs[0][0].images.to_vector<uint8_t>());
}

}  // namespace
}  // namespace trainer
