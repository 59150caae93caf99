// data.cache: the cache itself (budget, sharing between processes through shared memory,
// its fallback), and an image folder read through it with "encoded" and "decoded" (the same pixels, or
// the same crops within resampling; the same bad-file behaviour; no stale file after a rewrite).
#include "data/file_cache.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "data/data_error.h"
#include "data/image_codec.h"
#include "data/image_folder.h"
#include "data/temp_dir.h"
#include "nn/random.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using testing::write_bytes;

std::vector<uint8_t> bytes_of(size_t n, uint8_t first) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(first + i);
  return v;
}

bool holds(const FileCache& cache, int64_t index, const std::vector<uint8_t>& expected) {
  const CachedFile f = cache.find(index);
  return f.data && std::vector<uint8_t>(f.data, f.data + f.size) == expected;
}

// A name no other test process uses.
std::string shm_name(const std::string& what) {
  return "/trainer-test-" + std::to_string(::getpid()) + "-" + what;
}

bool shm_name_exists(const std::string& name) {
  const int fd = ::shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

TEST(FileCache, KeepsFilesUntilTheBudgetIsSpentAndNeverEvicts) {
  FileCacheOptions options;
  options.budget_bytes = 100;  // 8 bytes of size + the bytes, rounded up to 8, per entry
  FileCache cache(4, 1000, options);
  EXPECT_EQ(cache.capacity(), 104u);  // rounded up to 8
  EXPECT_FALSE(cache.find(0).data);
  const auto a = bytes_of(40, 1), b = bytes_of(30, 2), c = bytes_of(20, 3);
  EXPECT_TRUE(cache.insert(0, a.data(), a.size()));   // 48 bytes
  EXPECT_TRUE(cache.insert(1, b.data(), b.size()));   // 40 more: 88
  EXPECT_FALSE(cache.insert(2, c.data(), c.size()));  // 32 more would pass 104
  EXPECT_TRUE(holds(cache, 0, a));
  EXPECT_TRUE(holds(cache, 1, b));
  EXPECT_FALSE(cache.find(2).data);
  EXPECT_TRUE(cache.insert(0, c.data(), c.size()));  // already cached: the first bytes stay
  EXPECT_TRUE(holds(cache, 0, a));
  EXPECT_EQ(cache.files(), 2);
  EXPECT_EQ(cache.bytes(), 88u);
  EXPECT_FALSE(cache.find(-1).data);
  EXPECT_FALSE(cache.find(4).data);
  EXPECT_FALSE(cache.shared());
}

TEST(FileCache, TakesNoMoreThanTheFilesNeed) {
  FileCacheOptions options;
  options.budget_bytes = int64_t{1} << 40;  // a terabyte asked for, 3 small files listed
  FileCache cache(3, 300, options);
  EXPECT_LE(cache.capacity(), 300u + 3 * 16 + 8);  // each entry: its size word and padding
}

TEST(FileCache, ConcurrentInsertsOfTheSameFilesKeepOneCopyEach) {
  FileCacheOptions options;
  options.budget_bytes = 1 << 20;
  FileCache cache(64, 64 * 100, options);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int64_t i = 0; i < 64; ++i) {
        const auto v = bytes_of(100, static_cast<uint8_t>(i));
        cache.insert(i, v.data(), v.size());
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(cache.files(), 64);
  for (int64_t i = 0; i < 64; ++i) EXPECT_TRUE(holds(cache, i, bytes_of(100, static_cast<uint8_t>(i)))) << i;
}

TEST(FileCache, TheRanksOfANodeShareOneCacheAndTheNameGoesOnceAllHaveAttached) {
  const std::string name = shm_name("share");
  FileCacheOptions options;
  options.budget_bytes = 4096;
  options.shared_name = name;
  options.sharers = 2;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // local rank 1: attaches, caches file 1, waits for file 0 from rank 0
    options.create = false;
    FileCache cache(2, 1000, options);
    const auto b = bytes_of(50, 9);
    cache.insert(1, b.data(), b.size());
    for (int i = 0; i < 1000 && !cache.find(0).data; ++i) ::usleep(10000);
    ::_exit(cache.shared() && holds(cache, 0, bytes_of(70, 7)) ? 0 : 1);
  }
  FileCache cache(2, 1000, options);  // local rank 0 creates
  EXPECT_TRUE(cache.shared()) << cache.fallback_reason();
  const auto a = bytes_of(70, 7);
  cache.insert(0, a.data(), a.size());
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the other rank did not see rank 0's file";
  EXPECT_TRUE(holds(cache, 1, bytes_of(50, 9))) << "rank 0 does not see the other rank's file";
  EXPECT_EQ(cache.files(), 2);
  EXPECT_FALSE(shm_name_exists(name)) << "both ranks attached: nothing may be left in /dev/shm";
}

TEST(FileCache, TheCreatorRemovesTheNameWhenARankNeverCame) {
  const std::string name = shm_name("absent");
  FileCacheOptions options;
  options.budget_bytes = 4096;
  options.shared_name = name;
  options.sharers = 3;
  {
    FileCache cache(2, 1000, options);
    EXPECT_TRUE(cache.shared()) << cache.fallback_reason();
    EXPECT_TRUE(shm_name_exists(name));
  }
  EXPECT_FALSE(shm_name_exists(name));
}

TEST(FileCache, WithoutTheCreatorARankCachesOnItsOwnAndSaysWhy) {
  FileCacheOptions options;
  options.budget_bytes = 4000;
  options.shared_name = shm_name("nocreator");
  options.create = false;
  options.sharers = 4;
  options.attach_timeout_seconds = 0.05;
  FileCache cache(2, 100000, options);
  EXPECT_FALSE(cache.shared());
  EXPECT_NE(cache.fallback_reason().find("did not create it"), std::string::npos) << cache.fallback_reason();
  EXPECT_EQ(cache.capacity(), 1000u);  // a quarter of the node's budget: four ranks cache on their own
  const auto a = bytes_of(10, 1);
  EXPECT_TRUE(cache.insert(1, a.data(), a.size()));
  EXPECT_TRUE(holds(cache, 1, a));
}

TEST(FileCache, ABadNameFallsBackToThisProcess) {
  FileCacheOptions options;
  options.budget_bytes = 4096;
  options.shared_name = "/no/slashes/allowed";
  FileCache cache(1, 100, options);
  EXPECT_FALSE(cache.shared());
  EXPECT_NE(cache.fallback_reason().find("cannot create"), std::string::npos) << cache.fallback_reason();
}

TEST(FileCache, TheDefaultBudgetIsAQuarterOfAvailableMemory) {
  EXPECT_EQ(default_cache_bytes(int64_t{64} << 30), int64_t{16} << 30);
  EXPECT_EQ(default_cache_bytes(0), 0);
}

// --- an image folder read through the cache

std::vector<uint8_t> noise(int64_t width, int64_t height) {
  std::vector<uint8_t> pixels(static_cast<size_t>(width * height * 3));
  uint64_t state = static_cast<uint64_t>(width * 31 + height);
  for (uint8_t& p : pixels) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    p = static_cast<uint8_t>(state >> 56);
  }
  return pixels;
}

// Class "a": good JPEGs and PNG, a truncated JPEG, a zero-byte file, a corrupt JPEG (its scan data
// overwritten) and text named .jpg; class "b": good. Returns the indices of the bad files.
std::vector<int64_t> write_tree(const fs::path& root) {
  fs::create_directories(root / "a");
  fs::create_directories(root / "b");
  const std::vector<uint8_t> jpeg = encode_jpeg(noise(64, 48).data(), 64, 48, 3);
  write_bytes((root / "a" / "0_good.jpg").string(), jpeg);
  write_bytes((root / "a" / "1_truncated.jpg").string(), {jpeg.begin(), jpeg.begin() + jpeg.size() / 2});
  write_bytes((root / "a" / "2_zero.jpg").string(), {});
  std::vector<uint8_t> corrupt = jpeg;
  for (size_t i = corrupt.size() / 2; i < corrupt.size() - 2; ++i) corrupt[i] = 0xFF;
  write_bytes((root / "a" / "3_corrupt.jpg").string(), corrupt);
  std::ofstream(root / "a" / "4_text.jpg") << "not an image";
  write_bytes((root / "a" / "5_good.png").string(), encode_png(noise(30, 40).data(), 30, 40, 3));
  write_bytes((root / "b" / "0_good.jpg").string(), encode_jpeg(noise(80, 60).data(), 80, 60, 3));
  return {1, 2, 3, 4};
}

std::string error_of(const ImageFolder& dataset, int64_t index, bool augmented) {
  std::vector<uint8_t> pixels(static_cast<size_t>(dataset.sample_bytes()));
  Generator gen(5);
  try {
    if (augmented)
      dataset.read_augmented(index, pixels.data(), gen);
    else
      dataset.read_into(index, pixels.data());
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

ImageFolderOptions folder_options(bool train, CacheMode mode, BadSamplePolicy policy) {
  ImageFolderOptions options;
  options.image_size = 24;
  options.train = train;
  options.bad_samples = policy;
  options.warn = [](const std::string&) {};
  options.cache_mode = mode;
  if (mode != CacheMode::none) options.cache.budget_bytes = 1 << 20;
  return options;
}

double mean_abs_difference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += std::abs(int{a[i]} - int{b[i]});
  return sum / static_cast<double>(a.size());
}

// Each test runs with data.cache = "encoded" and "decoded".
class ImageFolderCache : public ::testing::TestWithParam<CacheMode> {
 protected:
  CacheMode mode() const { return GetParam(); }
  ImageFolderOptions options(bool train, BadSamplePolicy policy) const {
    return folder_options(train, mode(), policy);
  }
};

INSTANTIATE_TEST_SUITE_P(Modes, ImageFolderCache, ::testing::Values(CacheMode::encoded, CacheMode::decoded),
                         [](const auto& info) { return std::string(to_string(info.param)); });

// "encoded" gives the disk's pixels exactly; "decoded" the same crops of the kept, downscaled images,
// which differ by resampling only (these are noise pictures, the worst case for resampling; smooth
// pictures are bounded far tighter in decoded_cache_test.cpp).
TEST_P(ImageFolderCache, GivesTheSamePixelsAsTheDiskEpochAfterEpoch) {
  TempDir dir;
  const std::vector<int64_t> bad = write_tree(dir.path());
  for (const bool train : {true, false}) {
    const ImageFolder plain(dir.path().string(),
                            folder_options(train, CacheMode::none, BadSamplePolicy::skip));
    const ImageFolder cached(dir.path().string(), options(train, BadSamplePolicy::skip));
    ASSERT_NE(cached.cache(), nullptr);
    for (int epoch = 0; epoch < 3; ++epoch) {
      for (int64_t i = 0; i < plain.size(); ++i) {
        std::vector<uint8_t> a(static_cast<size_t>(plain.sample_bytes())), b(a.size());
        Generator ga(100 * epoch + i), gb(100 * epoch + i);
        EXPECT_EQ(plain.read_augmented(i, a.data(), ga), cached.read_augmented(i, b.data(), gb)) << i;
        EXPECT_EQ(ga.next_u64(), gb.next_u64()) << "the same draws, epoch " << epoch << " sample " << i;
        if (mode() == CacheMode::encoded)
          EXPECT_EQ(a, b) << "epoch " << epoch << " sample " << i;
        else
          EXPECT_LT(mean_abs_difference(a, b), 40.0) << "epoch " << epoch << " sample " << i;
      }
    }
    for (int64_t i = 0; i < cached.size(); ++i) {
      const bool is_bad = std::find(bad.begin(), bad.end(), i) != bad.end();
      // Only files that decoded are cached (in training, with "encoded", a truncated file may, when the
      // crop ends above the damage: then it does so from disk too; "decoded" needs the whole image).
      if (!train || i != 1 || mode() == CacheMode::decoded) {
        EXPECT_EQ(cached.cache()->find(i).data != nullptr, !is_bad) << i;
      }
    }
    EXPECT_EQ(plain.skipped_samples(), cached.skipped_samples());
    EXPECT_EQ(plain.bad_files(), cached.bad_files());
  }
}

TEST_P(ImageFolderCache, BadFilesFailAsWithoutTheCacheInErrorMode) {
  TempDir dir;
  const std::vector<int64_t> bad = write_tree(dir.path());
  for (const bool train : {true, false}) {
    const ImageFolder plain(dir.path().string(),
                            folder_options(train, CacheMode::none, BadSamplePolicy::error));
    const ImageFolder cached(dir.path().string(), options(train, BadSamplePolicy::error));
    for (int pass = 0; pass < 2; ++pass) {  // the second pass reads the good files from the cache
      for (int64_t i = 0; i < plain.size(); ++i) {
        const std::string expected = error_of(plain, i, true);
        EXPECT_EQ(error_of(cached, i, true), expected) << i;
        EXPECT_EQ(error_of(cached, i, false), error_of(plain, i, false)) << i;
        // A truncated file may decode in training when the crop ends above the damage, from disk as
        // from the cache; evaluation reads it whole and fails.
        const bool is_bad = std::find(bad.begin(), bad.end(), i) != bad.end();
        if (!train || i != 1) {
          EXPECT_EQ(expected.empty(), !is_bad) << i << ": " << expected;
        }
      }
    }
  }
}

// Each kind of bad file on its own, in skip mode: the same replacement (label and generator), the same
// one warning, the same counts as without the cache, in training; left out in evaluation.
TEST_P(ImageFolderCache, EachKindOfBadFileIsSkippedAsWithoutTheCache) {
  TempDir dir;
  const std::vector<int64_t> bad = write_tree(dir.path());
  for (const int64_t b : bad) {
    for (const bool train : {true, false}) {
      std::vector<std::string> plain_warnings, cached_warnings;
      ImageFolderOptions po = folder_options(train, CacheMode::none, BadSamplePolicy::skip);
      ImageFolderOptions co = options(train, BadSamplePolicy::skip);
      po.drop_bad_samples = co.drop_bad_samples = !train;
      po.warn = [&](const std::string& m) { plain_warnings.push_back(m); };
      co.warn = [&](const std::string& m) { cached_warnings.push_back(m); };
      const ImageFolder plain(dir.path().string(), po);
      const ImageFolder cached(dir.path().string(), co);
      for (int epoch = 0; epoch < 2; ++epoch) {
        std::vector<uint8_t> a(static_cast<size_t>(plain.sample_bytes())), c(a.size());
        Generator ga(7 + epoch), gc(7 + epoch);
        EXPECT_EQ(plain.read_augmented(b, a.data(), ga), cached.read_augmented(b, c.data(), gc)) << b;
        EXPECT_EQ(ga.next_u64(), gc.next_u64()) << b;
      }
      EXPECT_EQ(cached_warnings, plain_warnings) << b;
      EXPECT_EQ(cached.skipped_samples(), plain.skipped_samples()) << b;
      EXPECT_EQ(cached.bad_files(), plain.bad_files()) << b;
      if (!train || b != 1) EXPECT_EQ(cached.cache()->find(b).data, nullptr) << b;
    }
  }
}

TEST_P(ImageFolderCache, AFileWhoseSizeChangedSinceTheListingIsNotCached) {
  TempDir dir;
  write_tree(dir.path());
  const ImageFolder cached(dir.path().string(), options(true, BadSamplePolicy::error));
  // Rewritten between the listing and its first read: another image, another size.
  write_bytes((dir.path() / "b" / "0_good.jpg").string(), encode_jpeg(noise(90, 70).data(), 90, 70, 3));
  const int64_t last = cached.size() - 1;
  EXPECT_EQ(error_of(cached, last, true), "");
  EXPECT_FALSE(cached.cache()->find(last).data) << "a changing file must be read afresh every time";
  EXPECT_EQ(error_of(cached, 0, true), "");
  EXPECT_TRUE(cached.cache()->find(0).data);
}

TEST_P(ImageFolderCache, AFileTouchedSinceTheListingIsNotCached) {
  TempDir dir;
  write_tree(dir.path());
  const ImageFolder cached(dir.path().string(), options(true, BadSamplePolicy::error));
  // The same size, a later modification time: rewritten in place, say.
  const fs::path file = dir.path() / "b" / "0_good.jpg";
  fs::last_write_time(file, fs::last_write_time(file) + std::chrono::seconds(2));
  const int64_t last = cached.size() - 1;
  EXPECT_EQ(error_of(cached, last, true), "");
  EXPECT_FALSE(cached.cache()->find(last).data);
}

// The file is cached, then rewritten in place with another picture of the same size: the next use
// must give the new picture, as without the cache, and say once that the cache no longer holds it.
TEST_P(ImageFolderCache, AFileRewrittenAfterItWasCachedIsReadFromDiskAgain) {
  TempDir dir;
  write_tree(dir.path());
  std::vector<std::string> notes;
  for (const bool train : {true, false}) {
    ImageFolderOptions o = options(train, BadSamplePolicy::error);
    o.warn = [&](const std::string& m) { notes.push_back(m); };
    const fs::path file = dir.path() / "b" / "0_good.jpg";
    write_bytes(file.string(), encode_jpeg(noise(80, 60).data(), 80, 60, 3));
    const ImageFolder cached(dir.path().string(), o);
    const int64_t last = cached.size() - 1;
    std::vector<uint8_t> before(static_cast<size_t>(cached.sample_bytes())), after(before.size());
    Generator g0(3);
    cached.read_augmented(last, before.data(), g0);
    ASSERT_TRUE(cached.cache()->find(last).data);
    // Another picture, a flat grey one, padded after its end marker to the old file's size (decoders
    // stop at the marker).
    std::vector<uint8_t> grey(80 * 60 * 3, 128);
    std::vector<uint8_t> rewritten = encode_jpeg(grey.data(), 80, 60, 3);
    const size_t old_size = fs::file_size(file);
    ASSERT_LT(rewritten.size(), old_size);
    rewritten.resize(old_size);
    write_bytes(file.string(), rewritten);
    ASSERT_EQ(fs::file_size(file), old_size);
    fs::last_write_time(file, fs::last_write_time(file) + std::chrono::seconds(2));
    notes.clear();
    for (int use = 0; use < 2; ++use) {
      Generator g(3);
      cached.read_augmented(last, after.data(), g);
      for (const uint8_t p : after) EXPECT_NEAR(p, 128, 2) << "the cache's stale copy was used";
    }
    ASSERT_EQ(notes.size(), 1u) << "one note, however often the file is read";
    EXPECT_NE(notes[0].find("0_good.jpg changed on disk"), std::string::npos) << notes[0];
  }
}

TEST_P(ImageFolderCache, BeyondTheBudgetTheRestIsReadFromDisk) {
  TempDir dir;
  write_tree(dir.path());
  ImageFolderOptions o = options(true, BadSamplePolicy::skip);
  o.cache.budget_bytes = 64;  // less than any of the files, or of their pixels
  const ImageFolder small(dir.path().string(), o);
  const ImageFolder plain(dir.path().string(), folder_options(true, CacheMode::none, BadSamplePolicy::skip));
  for (int64_t i = 0; i < small.size(); ++i) {
    std::vector<uint8_t> a(static_cast<size_t>(plain.sample_bytes())), b(a.size());
    Generator ga(i), gb(i);
    EXPECT_EQ(plain.read_augmented(i, a.data(), ga), small.read_augmented(i, b.data(), gb));
    EXPECT_EQ(a, b) << i;
  }
  EXPECT_EQ(small.cache()->files(), 0);
}

}  // namespace
}  // namespace trainer
