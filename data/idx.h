#pragma once
// Reader (and writer, for tests and tools) of IDX files of unsigned bytes: the format of MNIST and
// Fashion-MNIST. A file is gzip-compressed or not, told apart by the gzip magic bytes rather than by
// its name. Reading checks the magic, the dimensions and that the payload is complete, and throws
// DataError naming the file and the problem otherwise; bytes after the payload are ignored.
#include <cstdint>
#include <string>
#include <vector>

namespace trainer {

inline constexpr uint32_t kIdxImagesMagic = 0x00000803;  // uint8, 3 dims: [count, rows, cols]
inline constexpr uint32_t kIdxLabelsMagic = 0x00000801;  // uint8, 1 dim: [count]

struct IdxImages {
  int64_t count = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> pixels;  // [count, rows, cols]
  uint64_t content_hash = 0;    // FNV-1a 64 of the decompressed header and payload
};

struct IdxLabels {
  std::vector<uint8_t> labels;  // [count]
  uint64_t content_hash = 0;    // FNV-1a 64 of the decompressed header and payload
};

IdxImages read_idx_images(const std::string& path);
// Every label must lie in [0, num_classes).
IdxLabels read_idx_labels(const std::string& path, int64_t num_classes);

// pixels.size() must equal count * rows * cols.
void write_idx_images(const std::string& path, const IdxImages& images, bool gzip);
void write_idx_labels(const std::string& path, const std::vector<uint8_t>& labels, bool gzip);

}  // namespace trainer
