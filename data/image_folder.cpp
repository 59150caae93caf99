#include "data/image_folder.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "data/data_error.h"
#include "data/decoded_cache.h"
#include "data/eval_crop.h"
#include "data/hash.h"
#include "data/image_codec.h"
#include "data/jpeg_region.h"
#include "data/path_check.h"
#include "nn/random.h"

namespace trainer {

namespace fs = std::filesystem;

namespace {

// Deeper than this is a symbolic-link loop, not a dataset (directory links are followed, as
// torchvision's os.walk(followlinks=True) does).
constexpr int kMaxDepth = 32;

bool is_image_name(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* extension : {".jpg", ".jpeg", ".png"}) {
    const size_t n = std::strlen(extension);
    if (lower.size() > n && lower.compare(lower.size() - n, n, extension) == 0) return true;
  }
  return false;
}

// How many files' contents the fingerprint reads, spread evenly over the list (all of a smaller
// dataset). ImageNet: 256 of 1.28M files, about 30 MB.
constexpr int64_t kContentSampleFiles = 256;

// hash continued over the bytes of the file at path; an unreadable file adds a marker instead (the
// bad-sample policy deals with it when it is read as a sample).
uint64_t hash_file_contents(const std::string& path, uint64_t hash) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return fnv1a64_text("<unreadable>", hash);
  char buffer[1 << 16];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, f)) > 0;) hash = fnv1a64_bytes(buffer, n, hash);
  std::fclose(f);
  return hash;
}

// What the listing records of a file, and what a cached entry must have been read under.
struct FileStamp {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  bool operator==(const FileStamp&) const = default;
};

FileStamp stamp_of(const struct stat& info) {
  return {static_cast<uint64_t>(info.st_size),
          static_cast<int64_t>(info.st_mtim.tv_sec) * 1000000000 + info.st_mtim.tv_nsec};
}

// The file's stamp now; {0, -1} when it cannot be had (never a listed stamp).
FileStamp stamp_of(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return {0, -1};
  return stamp_of(info);
}

struct ListedFile {
  std::string name;
  FileStamp stamp;
};

// One directory's image files, as one os.walk step gives them.
struct ListedDirectory {
  std::string relative;  // to the class directory; "" for the class directory itself
  std::vector<ListedFile> files;
};

[[noreturn]] void fail_listing(const fs::path& path, const std::error_code& error) {
  throw DataError(path.string() + ": cannot list: " + error.message());
}

void walk(const fs::path& class_dir, const std::string& relative, int depth,
          std::vector<ListedDirectory>& out) {
  const fs::path dir = relative.empty() ? class_dir : class_dir / relative;
  if (depth > kMaxDepth) {
    throw DataError(dir.string() + ": nested more than " + std::to_string(kMaxDepth) +
                    " directories deep: a symbolic link loop?");
  }
  ListedDirectory listed{relative, {}};
  std::vector<std::string> subdirectories;
  std::error_code error;
  fs::directory_iterator it(dir, error);
  if (error) fail_listing(dir, error);
  for (; it != fs::directory_iterator(); it.increment(error)) {
    if (error) fail_listing(dir, error);
    const std::string name = it->path().filename().string();
    std::error_code ignored;
    if (it->is_directory(ignored)) {
      subdirectories.push_back(name);
    } else if (is_image_name(name)) {
      // Anything else with an image name is a sample, as in torchvision: one that cannot be read (a
      // dangling link, say) is a bad sample at load time, not a silently different index list.
      // One stat for the size and the modification time, as file_size() alone would cost.
      const FileStamp stamp = stamp_of(it->path().string());
      listed.files.push_back({name, stamp.mtime_ns < 0 ? FileStamp{0, 0} : stamp});
    }
  }
  if (error) fail_listing(dir, error);
  std::sort(listed.files.begin(), listed.files.end(),
            [](const ListedFile& a, const ListedFile& b) { return a.name < b.name; });
  out.push_back(std::move(listed));
  for (const std::string& sub : subdirectories) {
    walk(class_dir, relative.empty() ? sub : relative + "/" + sub, depth + 1, out);
  }
}

// Reads the whole file into bytes and sets *stamp to its stamp, or to {0, -1} when the file changed
// while being read. Returns what went wrong, or an empty string.
std::string read_file(const std::string& path, std::vector<uint8_t>& bytes, FileStamp* stamp) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (!file) return "cannot open: " + std::error_code(errno, std::generic_category()).message();
  struct stat info {};
  std::string problem;
  if (::fstat(::fileno(file), &info) != 0) {
    problem = "cannot stat: " + std::error_code(errno, std::generic_category()).message();
  } else if (!S_ISREG(info.st_mode)) {
    problem = "not a regular file";
  } else {
    bytes.resize(static_cast<size_t>(info.st_size));
    const size_t got = std::fread(bytes.data(), 1, bytes.size(), file);
    if (got != bytes.size()) {
      problem = std::ferror(file) ? "read error: " + std::error_code(errno, std::generic_category()).message()
                                  : "read " + std::to_string(got) + " of " + std::to_string(bytes.size()) +
                                        " bytes: the file shrank while being read";
    }
    struct stat after {};
    const bool steady = ::fstat(::fileno(file), &after) == 0 && stamp_of(after) == stamp_of(info);
    *stamp = steady ? stamp_of(info) : FileStamp{0, -1};
  }
  std::fclose(file);
  return problem;
}

}  // namespace

ImageFolder::ImageFolder(const std::string& directory, ImageFolderOptions options)
    : options_(std::move(options)), bad_(std::make_unique<BadSampleTracker>(options_.warn)) {
  fs::path dir = fs::path(directory).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();  // a trailing slash
  directory_ = dir.string();
  name_ = "image_folder/" + dir.filename().string();
  if (options_.image_size < 1 || options_.image_size > 8192) {
    throw DataError(name_ + ": image_size must lie in [1, 8192], got " + std::to_string(options_.image_size));
  }
  if (options_.channels != 1 && options_.channels != 3) {
    throw DataError(name_ + ": images are decoded to 1 (grey) or 3 (RGB) channels, not " +
                    std::to_string(options_.channels));
  }
  const RandomResizedCropConfig& crop = options_.crop;
  if (!(crop.scale_min > 0 && crop.scale_min <= crop.scale_max && crop.ratio_min > 0 &&
        crop.ratio_min <= crop.ratio_max)) {
    throw DataError(name_ +
                    ": random resized crop needs 0 < scale_min <= scale_max and 0 < ratio_min <= ratio_max");
  }
  std::error_code error;
  const PathCheck check = check_directory(dir);
  if (check.problem == PathProblem::missing) throw DataError(directory_ + ": no such directory");
  if (!check) throw DataError(directory_ + ": " + check.reason);

  // Classes: the sub-directories, sorted (torchvision's find_classes).
  std::vector<std::string> found;
  fs::directory_iterator it(dir, error);
  if (error) fail_listing(dir, error);
  for (; it != fs::directory_iterator(); it.increment(error)) {
    if (error) fail_listing(dir, error);
    std::error_code ignored;
    if (it->is_directory(ignored)) found.push_back(it->path().filename().string());
  }
  if (error) fail_listing(dir, error);
  std::sort(found.begin(), found.end());
  if (found.empty()) {
    throw DataError(directory_ + ": no class sub-directories. HINT: an image folder holds one directory of " +
                    "images per class: " + directory_ + "/<class>/<image>.jpg");
  }
  classes_ = options_.classes.empty() ? found : options_.classes;

  list_files(dir, found);
  // Names and sizes miss a copy whose bytes differ at the same size (another encoder's output, bit rot, a
  // file rewritten in place): the contents of a sample of the files go into the hash too.
  const int64_t n = size();
  const int64_t sampled = std::min(n, kContentSampleFiles);
  for (int64_t k = 0; k < sampled; ++k)
    content_hash_ = hash_file_contents(path(k * n / sampled), content_hash_);
  open_cache();
}

ImageFolder::~ImageFolder() = default;

// Every image of every class directory in torchvision's order, with its label, size and mtime; the
// names and sizes go into the fingerprint.
void ImageFolder::list_files(const fs::path& dir, const std::vector<std::string>& found) {
  content_hash_ = kFnv1a64Offset;
  path_offsets_.push_back(0);
  for (const std::string& class_name : found) {
    const auto position = std::find(classes_.begin(), classes_.end(), class_name);
    if (position == classes_.end()) {
      throw DataError((dir / class_name).string() + ": class directory '" + class_name +
                      "' is not one of the " + std::to_string(classes_.size()) +
                      " training classes, so it has no label. HINT: every class of this split must also "
                      "be a directory of the training split");
    }
    const int32_t label = static_cast<int32_t>(position - classes_.begin());
    std::vector<ListedDirectory> listed;
    walk(dir / class_name, "", 0, listed);
    // os.walk, sorted: directories in path order, files in name order within each.
    std::sort(listed.begin(), listed.end(),
              [](const ListedDirectory& a, const ListedDirectory& b) { return a.relative < b.relative; });
    const size_t before = labels_.size();
    for (const ListedDirectory& d : listed) {
      for (const ListedFile& file : d.files) {
        const std::string relative =
            class_name + "/" + (d.relative.empty() ? "" : d.relative + "/") + file.name;
        paths_ += relative;
        path_offsets_.push_back(paths_.size());
        labels_.push_back(label);
        sizes_.push_back(file.stamp.size);
        mtimes_.push_back(file.stamp.mtime_ns);
        listed_bytes_ += file.stamp.size;
        // Not the modification time: a copy of the dataset keeps its fingerprint.
        content_hash_ = fnv1a64_bytes(relative.data(), relative.size() + 1, content_hash_);  // with the '\0'
        content_hash_ = fnv1a64_bytes(&file.stamp.size, sizeof(file.stamp.size), content_hash_);
      }
    }
    if (labels_.size() == before) {
      throw DataError((dir / class_name).string() +
                      ": no .jpg, .jpeg or .png files in this class directory. HINT: add its images or " +
                      "remove the directory");
    }
  }
}

void ImageFolder::open_cache() {
  if (options_.cache.budget_bytes <= 0) return;
  const int64_t n = size();
  FileCacheOptions cache = options_.cache;
  if (options_.cache_mode == CacheMode::none)
    throw DataError(name_ + ": a cache budget with data.cache = \"none\"");
  if (!cache.shared_name.empty()) {
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(content_hash_));
    cache.shared_name += std::string("-") + hex;
  }
  const uint64_t most_bytes =
      options_.cache_mode == CacheMode::decoded
          ? decoded_cache_most_bytes(n, decoded_cache_short_side(options_.image_size), options_.channels)
          : listed_bytes_;
  cache_ = std::make_unique<FileCache>(n, most_bytes, cache);
  changed_ = std::make_unique<std::atomic<uint8_t>[]>(static_cast<size_t>(n));
}

Normalization ImageFolder::normalization() const {
  if (options_.channels == 1) return {{0.4590f}, {0.2256f}};
  return {{0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}};
}

std::string ImageFolder::relative_path(int64_t index) const {
  check_index(index);
  const size_t i = static_cast<size_t>(index);
  return paths_.substr(path_offsets_[i], path_offsets_[i + 1] - path_offsets_[i]);
}

std::string ImageFolder::path(int64_t index) const { return directory_ + "/" + relative_path(index); }

int64_t ImageFolder::label(int64_t index) const {
  check_index(index);
  return labels_[static_cast<size_t>(index)];
}

std::string ImageFolder::try_load(int64_t index, uint8_t* hwc_out, Generator* gen) const {
  const CachedFile entry = usable_entry(index);
  if (entry.data && options_.cache_mode == CacheMode::decoded) {
    transform_entry(entry, hwc_out, gen);
    return "";
  }
  if (entry.data) return decode_and_transform(entry, hwc_out, gen);
  // Per-thread buffer: its capacity is reused from sample to sample.
  thread_local std::vector<uint8_t> file;
  FileStamp stamp;
  if (std::string problem = read_file(path(index), file, &stamp); !problem.empty()) return problem;
  const CachedFile bytes{file.data(), file.size()};
  // Only a read of the file as it was listed fills the cache: one that differs is changing under the
  // run, and is read afresh each time.
  const size_t i = static_cast<size_t>(index);
  const bool as_listed = cache_ && stamp == FileStamp{sizes_[i], mtimes_[i]} && !changed_[i].load();
  if (as_listed && options_.cache_mode == CacheMode::decoded && fill_decoded(index, bytes, hwc_out, gen))
    return "";
  const std::string problem = decode_and_transform(bytes, hwc_out, gen);
  // A file's bytes are cached once they decode.
  if (problem.empty() && as_listed && options_.cache_mode == CacheMode::encoded)
    cache_->insert(index, bytes.data, bytes.size);
  return problem;
}

CachedFile ImageFolder::usable_entry(int64_t index) const {
  const size_t i = static_cast<size_t>(index);
  if (!cache_ || changed_[i].load(std::memory_order_relaxed)) return {};
  const CachedFile entry = cache_->find(index);
  if (!entry.data) return {};
  // One stat a use (about a microsecond on a local disk, within NFS's attribute cache): a file
  // rewritten during the run is never trained on stale (data/file_cache.h).
  const std::string file = path(index);
  if (stamp_of(file) == FileStamp{sizes_[i], mtimes_[i]}) return entry;
  if (changed_[i].exchange(1) == 0) {
    const std::string note = "note: " + file +
                             " changed on disk after it was listed at start (its size or modification "
                             "time differs): data.cache no longer uses its cached copy, it is read from "
                             "disk from now on";
    if (options_.warn)
      options_.warn(note);
    else
      std::fprintf(stderr, "%s\n", note.c_str());
  }
  return {};
}

void ImageFolder::transform_entry(const CachedFile& entry, uint8_t* hwc_out, Generator* gen) const {
  const DecodedEntry image = read_decoded_entry(entry.data, entry.size, options_.channels);
  if (gen)
    random_resized_crop_from_entry(image, options_.crop, *gen, hwc_out, options_.image_size);
  else
    center_crop_from_entry(image, hwc_out, options_.image_size);
}

bool ImageFolder::fill_decoded(int64_t index, const CachedFile& file, uint8_t* hwc_out,
                               Generator* gen) const {
  thread_local std::vector<uint8_t> entry;
  try {
    const ImageInfo info = read_image_info(file.data, file.size);
    int64_t kept_height = 0, kept_width = 0;
    decoded_cache_size(info.height, info.width, decoded_cache_short_side(options_.image_size), kept_height,
                       kept_width);
    // Once the budget is spent, the cheaper decode of only the crop's region, as without the cache.
    if (!cache_->has_room_for(decoded_entry_bytes(kept_height, kept_width, options_.channels))) return false;
    make_decoded_entry(file.data, file.size, info, options_.channels,
                       decoded_cache_short_side(options_.image_size), entry);
  } catch (const ImageDecodeError&) {
    return false;  // decode_and_transform gives the error, or the crop, it gives without the cache
  }
  cache_->insert(index, entry.data(), entry.size());
  transform_entry({entry.data(), entry.size()}, hwc_out, gen);
  return true;
}

std::string ImageFolder::decode_and_transform(const CachedFile& file, uint8_t* hwc_out,
                                              Generator* gen) const {
  thread_local DecodedImage decoded;
  const int64_t size = options_.image_size, channels = options_.channels;
  try {
    const ImageInfo info = read_image_info(file.data, file.size);
    if (gen) {
      // RandomResizedCrop: the region is drawn on the full-size image, as torchvision does; decoding at
      // a smaller scale keeps the region at least size x size pixels.
      const CropBox box = random_resized_crop_box(info.height, info.width, options_.crop, *gen);
      const double min_scale = std::max(static_cast<double>(size) / static_cast<double>(box.width),
                                        static_cast<double>(size) / static_cast<double>(box.height));
      if (info.format == ImageFormat::jpeg) {
        // Only the rows and columns around the region are decoded; the output bytes are the same.
        thread_local JpegRegion region;
        if (decode_jpeg_region(file.data, file.size, channels, box, min_scale, region)) {
          resize_region(region.image.pixels.data(), region.image.height, region.image.width, channels,
                        region.crop, hwc_out, size, size);
          return "";
        }
      }
      decode_image(file.data, file.size, channels, decoded, min_scale);
      const CropBox scaled = scale_box(box, info.height, info.width, decoded.height, decoded.width);
      resize_region(decoded.pixels.data(), decoded.height, decoded.width, channels, scaled, hwc_out, size,
                    size);
      return "";
    }
    // Resize(shorter side to size * 256 / 224), then CenterCrop(size).
    decode_eval_crop(file.data, file.size, channels, eval_resize_size(size), size, hwc_out);
    return "";
  } catch (const ImageDecodeError& e) {
    return e.what();
  }
}

void ImageFolder::read_into(int64_t index, uint8_t* hwc_out) const {
  check_index(index);
  const std::string problem = try_load(index, hwc_out, nullptr);
  if (!problem.empty()) {
    throw DataError(
        path(index) + ": " + problem +
        ". HINT: replace or delete the file, or set data.bad_samples = \"skip\" to train without it");
  }
}

int64_t ImageFolder::read_augmented(int64_t index, uint8_t* hwc_out, Generator& gen) const {
  check_index(index);
  Generator* const draw = options_.train ? &gen : nullptr;
  if (options_.bad_samples == BadSamplePolicy::error) {
    const std::string problem = try_load(index, hwc_out, draw);
    if (!problem.empty()) {
      throw DataError(
          path(index) + ": " + problem +
          ". HINT: replace or delete the file, or set data.bad_samples = \"skip\" to train without it");
    }
    return labels_[static_cast<size_t>(index)];
  }
  if (options_.drop_bad_samples) {
    // Skip by leaving the sample out (an evaluation split): a replacement would be evaluated twice.
    if (bad_->known_bad(index)) return kDroppedSample;
    const std::string problem = try_load(index, hwc_out, draw);
    if (problem.empty()) return labels_[static_cast<size_t>(index)];
    bad_->mark_bad(index,
                   "warning: " + path(index) + ": " + problem +
                       "; skipping it (data.bad_samples = \"skip\"): it is left out of the evaluation");
    return kDroppedSample;
  }
  // Skip by replacing: take the first good sample from index on. Every attempt draws from a copy of gen as it
  // came in, so the pixels, the label and gen's state afterwards depend only on which files are bad, not on
  // which thread happened to find that out first.
  const int64_t n = size();
  for (int64_t k = 0; k < n; ++k) {
    const int64_t candidate = (index + k) % n;
    if (bad_->known_bad(candidate)) continue;
    std::string problem;
    if (draw) {
      Generator attempt = gen;
      problem = try_load(candidate, hwc_out, &attempt);
      if (problem.empty()) gen = attempt;
    } else {
      problem = try_load(candidate, hwc_out, nullptr);
    }
    if (problem.empty()) {
      if (candidate != index) bad_->count_replacement();
      return labels_[static_cast<size_t>(candidate)];
    }
    bad_->mark_bad(candidate,
                   "warning: " + path(candidate) + ": " + problem +
                       "; skipping it (data.bad_samples = \"skip\"): its sample is replaced by the "
                       "next readable one");
  }
  throw DataError(directory_ + ": none of the " + std::to_string(n) +
                  " images can be decoded, so bad_samples = \"skip\" has nothing to replace them with");
}

}  // namespace trainer
