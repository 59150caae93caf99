#pragma once
// torchvision's ImageFolder: a directory with one sub-directory of images per class,
//   directory/<class>/**/*.{jpg,jpeg,png}   (extensions case-insensitive; other files are ignored)
// Classes are the sub-directory names sorted (byte order), labelled 0, 1, ...; files are listed like
// torchvision's os.walk (directories in path order, files sorted within each), so a sample's index
// and label are those torchvision gives. Sub-directories of a class directory are searched too.
//
// Images come in any size; every sample leaves read_augmented() at image_size x image_size x
// channels, so batches stack (see data/resized_crop.h): a RandomResizedCrop in training mode, a
// Resize + CenterCrop in evaluation mode. Of a JPEG only the crop's rows and columns are decoded
// (data/jpeg_region.h), at a reduced DCT scale when the result is shrunk anyway. Decoding happens on
// the loader's worker threads; only the file list is in memory, and with options.cache the bytes
// (data.cache = "encoded") or the downscaled pixels (data.cache = "decoded", data/decoded_cache.h) of
// the files read so far (data/file_cache.h, which also says what the cache assumes of the files).
//
// With data.cache = "decoded", a file's first read while the cache has room decodes it whole (not only
// the crop's region) and keeps it; the sample comes from the kept pixels, as in later epochs. A file
// that does not decode whole is not kept and goes the way it goes without the cache (the same error,
// or the same pixels where the crop's region decodes), so bad files behave exactly as without it.
//
// Files whose image cannot be decoded are handled by the BadSamplePolicy (data/bad_samples.h). The
// fingerprint hashes the class list, every file's relative path and size, and the contents of 256 files
// spread evenly over the list (all files of a smaller dataset): reading all of ImageNet's 140 GB at
// start-up would take minutes, so a copy that differs only in the contents of unsampled files of the
// same sizes goes unnoticed.
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "data/bad_samples.h"
#include "data/cache_mode.h"
#include "data/dataset.h"
#include "data/file_cache.h"
#include "data/resized_crop.h"

namespace trainer {

struct ImageFolderOptions {
  int64_t image_size = 224;  // output height and width
  int64_t channels = 3;      // 3 (RGB) or 1 (grey); images are converted to it
  // true: RandomResizedCrop(image_size, crop) in read_augmented; false: Resize + CenterCrop.
  bool train = false;
  RandomResizedCropConfig crop;
  BadSamplePolicy bad_samples = BadSamplePolicy::error;
  BadSampleWarn warn;  // bad_samples = skip: one line per bad file; empty = stderr
  // bad_samples = skip leaves a bad sample out (kDroppedSample) instead of replacing it: for an
  // evaluation split, where a replacement would count another image twice.
  bool drop_bad_samples = false;
  // The class list, in label order. Empty: the sorted sub-directories. Give the training split's
  // list to the evaluation split so that labels agree even when a class has no evaluation images; a
  // sub-directory not in the list is then an error.
  std::vector<std::string> classes;
  // data.cache: files kept in memory after their first good read (data/file_cache.h), as cache_mode
  // says (encoded bytes or decoded pixels). budget_bytes 0 = no cache. A shared_name is completed with
  // this dataset's fingerprint, so that the training and evaluation splits, and different datasets,
  // never share a cache.
  FileCacheOptions cache;
  CacheMode cache_mode = CacheMode::encoded;  // what the cache keeps when cache.budget_bytes > 0
};

class ImageFolder : public Dataset {
 public:
  // Lists the files (no decoding). Throws DataError naming the directory when it is missing, has no
  // class sub-directories, when a class directory holds no images, or for a bad option.
  explicit ImageFolder(const std::string& directory, ImageFolderOptions options = {});
  ~ImageFolder() override;

  std::string name() const override { return name_; }  // "image_folder/<directory name>"
  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  int64_t num_classes() const override { return static_cast<int64_t>(classes_.size()); }
  int64_t channels() const override { return options_.channels; }
  int64_t height() const override { return options_.image_size; }
  int64_t width() const override { return options_.image_size; }
  const std::vector<std::string>& class_names() const override { return classes_; }
  // ImageNet's statistics (RGB; their luma for grey), what models trained on such folders expect.
  Normalization normalization() const override;
  // The evaluation view (Resize + CenterCrop) whatever the mode, and strict: a bad file always throws
  // DataError, whatever the policy.
  void read_into(int64_t index, uint8_t* hwc_out) const override;
  int64_t label(int64_t index) const override;
  // The mode's view, drawing the random crop from gen in training mode; applies the bad-sample policy
  // (with "skip", a bad file is replaced, or left out with drop_bad_samples).
  int64_t read_augmented(int64_t index, uint8_t* hwc_out, Generator& gen) const override;
  int64_t skipped_samples() const override { return bad_->replacements(); }
  std::string fingerprint() const override { return describe(content_hash_); }

  const std::string& directory() const { return directory_; }
  std::string relative_path(int64_t index) const;  // "<class>/<file>"
  std::string path(int64_t index) const;           // directory/relative_path
  const ImageFolderOptions& options() const { return options_; }
  int64_t bad_files() const { return bad_->bad_files(); }  // distinct files found bad so far (skip mode)
  const FileCache* cache() const { return cache_.get(); }  // null without data.cache
  CacheMode cache_mode() const { return cache_ ? options_.cache_mode : CacheMode::none; }
  uint64_t listed_bytes() const { return listed_bytes_; }  // the files' sizes at start, added up

 private:
  void list_files(const std::filesystem::path& dir, const std::vector<std::string>& found);
  void open_cache();  // data.cache: the budget's FileCache, shared under this dataset's fingerprint
  // Reads, decodes and transforms the file of `index` into hwc_out, drawing from gen when it is not
  // null (training mode). Returns an empty string on success, else what is wrong with the file.
  std::string try_load(int64_t index, uint8_t* hwc_out, Generator* gen) const;
  // try_load's work once the bytes are in memory.
  std::string decode_and_transform(const CachedFile& file, uint8_t* hwc_out, Generator* gen) const;
  // The cache's entry of `index`, or none when the file is not cached or has changed on disk since the
  // listing (then it is read from disk from now on, and a note says so once).
  CachedFile usable_entry(int64_t index) const;
  // data.cache = "decoded": the sample from an entry of decoded pixels.
  void transform_entry(const CachedFile& entry, uint8_t* hwc_out, Generator* gen) const;
  // data.cache = "decoded", a file read as listed: decodes it whole into a new entry and serves the
  // sample from it. false, having drawn nothing from gen, when the cache has no room for it or the
  // image does not decode whole: the caller then goes the way without the cache.
  bool fill_decoded(int64_t index, const CachedFile& file, uint8_t* hwc_out, Generator* gen) const;

  std::string directory_;
  std::string name_;
  ImageFolderOptions options_;
  std::vector<std::string> classes_;
  std::string paths_;                   // relative paths, back to back
  std::vector<uint64_t> path_offsets_;  // sample i's path is paths_[offsets[i], offsets[i + 1])
  std::vector<int32_t> labels_;
  std::vector<uint64_t> sizes_;  // each file's size when listed: a cached entry must be of it
  std::vector<int64_t> mtimes_;  // and its modification time (ns since the epoch)
  std::unique_ptr<std::atomic<uint8_t>[]> changed_;  // per file: found changed since the listing
  uint64_t listed_bytes_ = 0;
  uint64_t content_hash_ = 0;
  std::unique_ptr<FileCache> cache_;
  std::unique_ptr<BadSampleTracker> bad_;
};

}  // namespace trainer
