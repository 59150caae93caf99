#pragma once
// Fashion-MNIST (Zalando): 28x28 grey images of clothing in 10 classes, 60000 for training and 10000
// for testing, as IDX files, gzip-compressed or not. Debian's dataset-fashion-mnist package installs
// them under kFashionMnistDefaultRoot. The whole split is decoded into memory at construction
// (47 MB for train), so reads are a memcpy.
#include <string>
#include <string_view>
#include <vector>

#include "data/dataset.h"

namespace trainer {

inline constexpr const char* kFashionMnistDefaultRoot = "/usr/share/datasets/fashion-mnist";

class FashionMnist : public Dataset {
 public:
  // split is "train" or "test". Throws DataError naming the path, with a HINT, when root or a file is
  // missing, and naming the file and the problem when one is corrupt.
  explicit FashionMnist(const std::string& root = kFashionMnistDefaultRoot, std::string_view split = "train");

  inline static const std::vector<std::string> kClassNames = {
      "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
      "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  // Mean and standard deviation of the training pixels scaled to [0, 1], the values commonly quoted.
  static constexpr float kMean = 0.2860f;
  static constexpr float kStd = 0.3530f;

  std::string name() const override { return "fashion-mnist/" + split_; }
  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  int64_t num_classes() const override { return 10; }
  int64_t channels() const override { return 1; }
  int64_t height() const override { return 28; }
  int64_t width() const override { return 28; }
  const std::vector<std::string>& class_names() const override { return kClassNames; }
  Normalization normalization() const override { return {{kMean}, {kStd}}; }
  void read_into(int64_t index, uint8_t* hwc_out) const override;
  int64_t label(int64_t index) const override;
  std::string fingerprint() const override;

  const std::string& images_path() const { return images_path_; }
  const std::string& labels_path() const { return labels_path_; }

 private:
  std::string split_;
  std::string images_path_;
  std::string labels_path_;
  std::vector<uint8_t> pixels_;  // [N, 28, 28]
  std::vector<uint8_t> labels_;  // [N]
  uint64_t content_hash_ = 0;
};

}  // namespace trainer
