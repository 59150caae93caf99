#pragma once
// CIFAR-10 and CIFAR-100 (Krizhevsky, 2009) in their "binary version": 32x32 RGB images, 50000 for
// training and 10000 for testing, in files of fixed-size records. A record is the label byte(s)
// followed by 3072 pixel bytes stored channel by channel (1024 red, 1024 green, 1024 blue, each row by
// row); they are converted to HWC at load. The whole split is decoded into memory (150 MB for train).
//
//   CIFAR-10  (cifar-10-binary.tar.gz -> cifar-10-batches-bin/): data_batch_1.bin .. data_batch_5.bin,
//             test_batch.bin; record = label (0..9) + pixels; class names in batches.meta.txt.
//   CIFAR-100 (cifar-100-binary.tar.gz -> cifar-100-binary/): train.bin, test.bin; record = coarse
//             label (0..19) + fine label (0..99) + pixels. The fine label is the label; class names in
//             fine_label_names.txt.
//
// root is that extracted directory or the directory holding it. The class-name files are optional
// (the standard names are built in), but one that is present must hold one name per class.
#include <string>
#include <string_view>
#include <vector>

#include "data/dataset.h"

namespace trainer {

enum class CifarVariant { cifar10, cifar100 };

class Cifar : public Dataset {
 public:
  // split is "train" or "test". Throws DataError naming the path, with a HINT on where to get the
  // binary version, when root or a file is missing; naming the file and its byte count when its size
  // is not a whole number of records; naming the file and record when a label is out of range.
  Cifar(CifarVariant variant, const std::string& root, std::string_view split = "train");

  static const std::vector<std::string> kCifar10ClassNames;
  static const std::vector<std::string> kCifar100ClassNames;  // fine labels
  static constexpr int64_t kImageBytes = 3 * 32 * 32;

  std::string name() const override;
  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  int64_t num_classes() const override { return static_cast<int64_t>(class_names_.size()); }
  int64_t channels() const override { return 3; }
  int64_t height() const override { return 32; }
  int64_t width() const override { return 32; }
  const std::vector<std::string>& class_names() const override { return class_names_; }
  // The commonly quoted statistics of the training pixels scaled to [0, 1].
  Normalization normalization() const override;
  void read_into(int64_t index, uint8_t* hwc_out) const override;
  int64_t label(int64_t index) const override;
  std::string fingerprint() const override { return describe(content_hash_); }

  CifarVariant variant() const { return variant_; }
  const std::string& directory() const { return directory_; }  // where the batch files were found
  const std::vector<std::string>& files() const { return files_; }
  // CIFAR-100 only: the superclass (0..19) of each image; empty for CIFAR-10.
  const std::vector<uint8_t>& coarse_labels() const { return coarse_labels_; }

 private:
  void load_file(const std::string& path);

  CifarVariant variant_;
  std::string split_;
  std::string directory_;
  std::vector<std::string> files_;
  std::vector<std::string> class_names_;
  std::vector<uint8_t> pixels_;  // [N, 32, 32, 3]
  std::vector<uint8_t> labels_;  // [N]
  std::vector<uint8_t> coarse_labels_;
  uint64_t content_hash_ = 0;
};

}  // namespace trainer
