#include "data/fashion_mnist.h"

#include <cstring>
#include <filesystem>

#include "data/data_error.h"
#include "data/hash.h"
#include "data/idx.h"
#include "data/path_check.h"

namespace trainer {

namespace {

constexpr const char* kInstallHint = "HINT: apt-get install dataset-fashion-mnist, or set data.root";

// The file named `stem` or `stem`.gz under root; the uncompressed one wins when both exist because it
// loads faster. Throws with the install hint when neither exists, with the reason when one exists but
// cannot be used.
std::string find_file(const std::filesystem::path& root, const std::string& stem) {
  for (const std::string& name : {stem, stem + ".gz"}) {
    const std::filesystem::path path = root / name;
    const PathCheck check = check_regular_file(path);
    if (check) return path.string();
    if (check.problem != PathProblem::missing) throw DataError(path.string() + ": " + check.reason);
  }
  throw DataError((root / stem).string() + "(.gz): no such file. " + kInstallHint);
}

}  // namespace

FashionMnist::FashionMnist(const std::string& root, std::string_view split) : split_(split) {
  if (split != "train" && split != "test") {
    throw DataError("fashion-mnist: unknown split '" + split_ + "': expected train or test");
  }
  const PathCheck dir = check_directory(root);
  if (dir.problem == PathProblem::unreachable) throw DataError(root + ": " + dir.reason);
  if (!dir) throw DataError(root + ": no such directory (Fashion-MNIST root). " + kInstallHint);
  const std::string prefix = split == "train" ? "train" : "t10k";
  images_path_ = find_file(root, prefix + "-images-idx3-ubyte");
  labels_path_ = find_file(root, prefix + "-labels-idx1-ubyte");

  IdxImages images = read_idx_images(images_path_);
  if (images.rows != height() || images.cols != width()) {
    throw DataError(images_path_ + ": images are " + std::to_string(images.rows) + "x" +
                    std::to_string(images.cols) + ", Fashion-MNIST's are 28x28");
  }
  IdxLabels labels = read_idx_labels(labels_path_, num_classes());
  if (static_cast<int64_t>(labels.labels.size()) != images.count) {
    throw DataError(labels_path_ + ": holds " + std::to_string(labels.labels.size()) + " labels but " +
                    images_path_ + " holds " + std::to_string(images.count) + " images");
  }
  pixels_ = std::move(images.pixels);
  labels_ = std::move(labels.labels);
  content_hash_ = mix_seed(images.content_hash, labels.content_hash);
}

void FashionMnist::read_into(int64_t index, uint8_t* hwc_out) const {
  check_index(index);
  const size_t bytes = static_cast<size_t>(sample_bytes());
  std::memcpy(hwc_out, pixels_.data() + static_cast<size_t>(index) * bytes, bytes);
}

int64_t FashionMnist::label(int64_t index) const {
  check_index(index);
  return labels_[static_cast<size_t>(index)];
}

std::string FashionMnist::fingerprint() const { return describe(content_hash_); }

}  // namespace trainer
