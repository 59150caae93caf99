#include "data/cifar.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "data/data_error.h"
#include "data/hash.h"
#include "data/path_check.h"

namespace trainer {

const std::vector<std::string> Cifar::kCifar10ClassNames = {
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"};

const std::vector<std::string> Cifar::kCifar100ClassNames = {
    "apple",      "aquarium_fish", "baby",         "bear",       "beaver",      "bed",         "bee",
    "beetle",     "bicycle",       "bottle",       "bowl",       "boy",         "bridge",      "bus",
    "butterfly",  "camel",         "can",          "castle",     "caterpillar", "cattle",      "chair",
    "chimpanzee", "clock",         "cloud",        "cockroach",  "couch",       "crab",        "crocodile",
    "cup",        "dinosaur",      "dolphin",      "elephant",   "flatfish",    "forest",      "fox",
    "girl",       "hamster",       "house",        "kangaroo",   "keyboard",    "lamp",        "lawn_mower",
    "leopard",    "lion",          "lizard",       "lobster",    "man",         "maple_tree",  "motorcycle",
    "mountain",   "mouse",         "mushroom",     "oak_tree",   "orange",      "orchid",      "otter",
    "palm_tree",  "pear",          "pickup_truck", "pine_tree",  "plain",       "plate",       "poppy",
    "porcupine",  "possum",        "rabbit",       "raccoon",    "ray",         "road",        "rocket",
    "rose",       "sea",           "seal",         "shark",      "shrew",       "skunk",       "skyscraper",
    "snail",      "snake",         "spider",       "squirrel",   "streetcar",   "sunflower",   "sweet_pepper",
    "table",      "tank",          "telephone",    "television", "tiger",       "tractor",     "train",
    "trout",      "tulip",         "turtle",       "wardrobe",   "whale",       "willow_tree", "wolf",
    "woman",      "worm"};

namespace {

// Everything that differs between the two variants.
struct CifarLayout {
  const char* display_name;  // also the name() prefix
  const char* archive;       // the download
  const char* extracted_dir;
  std::vector<std::string> train_files;
  std::vector<std::string> test_files;
  int label_bytes;   // label bytes before the pixels of each record
  int label_offset;  // which of them is the label
  int64_t num_classes;
  const char* names_file;
  const std::vector<std::string>* default_names;
};

const CifarLayout& layout_of(CifarVariant variant) {
  static const CifarLayout cifar10{
      "cifar10",
      "cifar-10-binary.tar.gz",
      "cifar-10-batches-bin",
      {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin", "data_batch_5.bin"},
      {"test_batch.bin"},
      1,
      0,
      10,
      "batches.meta.txt",
      &Cifar::kCifar10ClassNames};
  static const CifarLayout cifar100{
      "cifar100", "cifar-100-binary.tar.gz", "cifar-100-binary",         {"train.bin"}, {"test.bin"}, 2, 1,
      100,        "fine_label_names.txt",    &Cifar::kCifar100ClassNames};
  return variant == CifarVariant::cifar10 ? cifar10 : cifar100;
}

std::string install_hint(const CifarLayout& layout) {
  return std::string("HINT: download the binary version (") + layout.archive +
         ", not the python or matlab one) from https://www.cs.toronto.edu/~kriz/cifar.html, extract it "
         "and set data.root to the " +
         layout.extracted_dir + " directory";
}

std::vector<uint8_t> read_whole_file(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (!file) throw DataError(path + ": cannot open: " + std::strerror(errno));
  std::vector<uint8_t> bytes;
  std::error_code ignored;
  const auto expected = std::filesystem::file_size(path, ignored);
  if (!ignored) bytes.reserve(static_cast<size_t>(expected));
  uint8_t chunk[1 << 16];
  size_t got;
  while ((got = std::fread(chunk, 1, sizeof(chunk), file)) > 0) bytes.insert(bytes.end(), chunk, chunk + got);
  const bool failed = std::ferror(file) != 0;
  std::fclose(file);
  if (failed) throw DataError(path + ": read error");
  return bytes;
}

// One class name per non-empty line (batches.meta.txt ends with blank lines).
std::vector<std::string> read_class_names(const std::string& path, int64_t expected) {
  std::ifstream in(path);
  if (!in) throw DataError(path + ": cannot open: " + std::strerror(errno));
  std::vector<std::string> names;
  std::string line;
  while (std::getline(in, line)) {
    const size_t begin = line.find_first_not_of(" \t\r");
    if (begin == std::string::npos) continue;
    names.push_back(line.substr(begin, line.find_last_not_of(" \t\r") + 1 - begin));
  }
  if (static_cast<int64_t>(names.size()) != expected) {
    throw DataError(path + ": holds " + std::to_string(names.size()) + " class names, expected " +
                    std::to_string(expected) + " (one per line). HINT: restore the file or delete it to " +
                    "use the standard names");
  }
  return names;
}

}  // namespace

Cifar::Cifar(CifarVariant variant, const std::string& root, std::string_view split)
    : variant_(variant), split_(split) {
  const CifarLayout& layout = layout_of(variant);
  if (split != "train" && split != "test") {
    throw DataError(std::string(layout.display_name) + ": unknown split '" + split_ +
                    "': expected train or test");
  }
  namespace fs = std::filesystem;
  std::error_code error;
  const PathCheck dir = check_directory(root);
  if (dir.problem == PathProblem::unreachable) throw DataError(root + ": " + dir.reason);
  if (!dir) {
    throw DataError(root + ": no such directory (" + layout.display_name + " root). " + install_hint(layout));
  }
  // Accept the directory that holds the extracted one, as well as the extracted one itself.
  fs::path directory = root;
  if (fs::is_directory(directory / layout.extracted_dir, error)) directory /= layout.extracted_dir;
  directory_ = directory.string();

  for (const std::string& name : split == "train" ? layout.train_files : layout.test_files) {
    const std::string path = (directory / name).string();
    const PathCheck file = check_regular_file(path);
    if (file.problem == PathProblem::missing)
      throw DataError(path + ": no such file. " + install_hint(layout));
    if (!file) throw DataError(path + ": " + file.reason);
    files_.push_back(path);
  }
  content_hash_ = kFnv1a64Offset;
  for (const std::string& path : files_) load_file(path);

  const std::string names_path = (directory / layout.names_file).string();
  class_names_ = fs::is_regular_file(names_path, error) ? read_class_names(names_path, layout.num_classes)
                                                        : *layout.default_names;
}

void Cifar::load_file(const std::string& path) {
  const CifarLayout& layout = layout_of(variant_);
  const std::vector<uint8_t> bytes = read_whole_file(path);
  const size_t record_bytes = static_cast<size_t>(layout.label_bytes + kImageBytes);
  if (bytes.empty() || bytes.size() % record_bytes != 0) {
    throw DataError(path + ": " + std::to_string(bytes.size()) + " bytes is not a whole number of " +
                    std::to_string(record_bytes) + "-byte " + layout.display_name + " records (" +
                    std::to_string(layout.label_bytes) + " label byte" + (layout.label_bytes > 1 ? "s" : "") +
                    " + 3072 pixel bytes): the file is truncated or not a " + layout.display_name +
                    " binary batch. " + install_hint(layout));
  }
  content_hash_ = fnv1a64_bytes(bytes.data(), bytes.size(), content_hash_);

  const size_t records = bytes.size() / record_bytes;
  const size_t first = labels_.size();
  labels_.resize(first + records);
  pixels_.resize((first + records) * kImageBytes);
  if (variant_ == CifarVariant::cifar100) coarse_labels_.resize(first + records);
  constexpr int64_t kPlane = 32 * 32;
  for (size_t r = 0; r < records; ++r) {
    const uint8_t* record = bytes.data() + r * record_bytes;
    const uint8_t label = record[layout.label_offset];
    if (label >= layout.num_classes) {
      throw DataError(path + ": record " + std::to_string(r) + " has label " + std::to_string(label) +
                      ", outside [0, " + std::to_string(layout.num_classes) +
                      "): the file is corrupt or not a " + layout.display_name + " binary batch. " +
                      install_hint(layout));
    }
    if (variant_ == CifarVariant::cifar100) {
      if (record[0] >= 20) {
        throw DataError(path + ": record " + std::to_string(r) + " has coarse label " +
                        std::to_string(record[0]) + ", outside [0, 20): the file is corrupt or not a " +
                        layout.display_name + " binary batch");
      }
      coarse_labels_[first + r] = record[0];
    }
    labels_[first + r] = label;
    // [3, 32, 32] -> [32, 32, 3]
    const uint8_t* chw = record + layout.label_bytes;
    uint8_t* hwc = pixels_.data() + (first + r) * kImageBytes;
    for (int64_t p = 0; p < kPlane; ++p) {
      hwc[3 * p + 0] = chw[p];
      hwc[3 * p + 1] = chw[kPlane + p];
      hwc[3 * p + 2] = chw[2 * kPlane + p];
    }
  }
}

std::string Cifar::name() const { return std::string(layout_of(variant_).display_name) + "/" + split_; }

Normalization Cifar::normalization() const {
  if (variant_ == CifarVariant::cifar10) return {{0.4914f, 0.4822f, 0.4465f}, {0.2470f, 0.2435f, 0.2616f}};
  return {{0.5071f, 0.4865f, 0.4409f}, {0.2673f, 0.2564f, 0.2762f}};
}

void Cifar::read_into(int64_t index, uint8_t* hwc_out) const {
  check_index(index);
  std::memcpy(hwc_out, pixels_.data() + static_cast<size_t>(index) * kImageBytes, kImageBytes);
}

int64_t Cifar::label(int64_t index) const {
  check_index(index);
  return labels_[static_cast<size_t>(index)];
}

}  // namespace trainer
