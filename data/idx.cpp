#include "data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>

#include "data/data_error.h"
#include "data/gzip_or_raw_reader.h"
#include "data/hash.h"

namespace trainer {

namespace {

// Larger payloads than this are a corrupt header, not a dataset (and would overflow the size math).
constexpr uint64_t kMaxPayloadBytes = uint64_t{1} << 40;

std::string hex32(uint32_t value) {
  char text[11];
  std::snprintf(text, sizeof(text), "0x%08x", value);
  return text;
}

std::string describe_magic(uint32_t magic) {
  if (magic == kIdxImagesMagic) return "IDX uint8 images";
  if (magic == kIdxLabelsMagic) return "IDX uint8 labels";
  if ((magic >> 16) == 0) {
    return "IDX type 0x" + hex32(magic).substr(6, 2) + " with " + std::to_string(magic & 0xff) + " dims";
  }
  return "not an IDX file";
}

uint32_t big_endian_u32(const uint8_t* bytes) {
  return uint32_t{bytes[0]} << 24 | uint32_t{bytes[1]} << 16 | uint32_t{bytes[2]} << 8 | bytes[3];
}

void put_big_endian_u32(uint32_t value, std::vector<uint8_t>& out) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(value >> shift));
}

std::string describe_dims(const std::vector<uint32_t>& dims) {
  if (dims.size() == 3) {
    return std::to_string(dims[0]) + " images of " + std::to_string(dims[1]) + "x" + std::to_string(dims[2]);
  }
  return std::to_string(dims[0]) + " labels";
}

struct IdxContent {
  std::vector<uint32_t> dims;
  std::vector<uint8_t> payload;
  uint64_t hash = 0;
};

// Reads exactly `count` bytes when the data holds them; fewer means the data ended first.
size_t read_up_to(GzipOrRawReader& reader, uint8_t* out, size_t count) {
  size_t total = 0;
  while (total < count) {
    const size_t got = reader.read(out + total, count - total);
    if (got == 0) break;
    total += got;
  }
  return total;
}

IdxContent read_idx(const std::string& path, uint32_t expected_magic) {
  GzipOrRawReader reader(path);
  const auto fail = [&](const std::string& problem) { throw DataError(path + ": " + problem); };
  const std::string cut_note =
      " (the gzip stream is cut short: the file looks like an interrupted download or copy)";
  const int ndims = static_cast<int>(expected_magic & 0xff);
  const size_t header_bytes = 4 + 4 * static_cast<size_t>(ndims);

  uint8_t header[4 + 4 * 255];
  size_t got = read_up_to(reader, header, 4);
  if (got == 4) {
    const uint32_t magic = big_endian_u32(header);
    if (magic != expected_magic) {
      fail("bad magic " + hex32(magic) + " (" + describe_magic(magic) + "): expected " +
           hex32(expected_magic) + " (" + describe_magic(expected_magic) + ")");
    }
    got += read_up_to(reader, header + 4, header_bytes - 4);
  }
  if (got < header_bytes) {
    fail("truncated: the file ends inside the " + std::to_string(header_bytes) +
         "-byte IDX header (it holds " + std::to_string(got) + " bytes)" +
         (reader.cut_short() ? cut_note : ""));
  }

  IdxContent content;
  uint64_t payload_bytes = 1;
  for (int d = 0; d < ndims; ++d) {
    content.dims.push_back(big_endian_u32(header + 4 + 4 * d));
    // Saturate rather than overflow: three 32-bit dimensions can exceed 64 bits.
    const uint64_t dim = content.dims.back();
    payload_bytes =
        dim != 0 && payload_bytes > kMaxPayloadBytes / dim ? kMaxPayloadBytes + 1 : payload_bytes * dim;
  }
  if (ndims == 3 && (content.dims[1] == 0 || content.dims[2] == 0)) {
    fail("bad dimensions: " + describe_dims(content.dims) + " (rows and columns must be positive)");
  }
  if (payload_bytes > kMaxPayloadBytes) {
    fail("bad dimensions: " + describe_dims(content.dims) + " is over " + std::to_string(kMaxPayloadBytes) +
         " bytes; the header is corrupt");
  }

  // Grow the buffer as data arrives rather than trusting the header up front: a corrupt header on a
  // small file must give a clear error, not a multi-gigabyte allocation.
  const size_t expected = static_cast<size_t>(payload_bytes);
  size_t have = 0;
  while (have < expected) {
    const size_t chunk = std::min(expected - have, std::max(have, size_t{1} << 20));
    content.payload.resize(have + chunk);
    const size_t read = read_up_to(reader, content.payload.data() + have, chunk);
    have += read;
    if (read < chunk) break;
  }
  content.payload.resize(have);
  if (have < expected) {
    fail("truncated: header says " + describe_dims(content.dims) + " (" + std::to_string(expected) +
         " bytes) but the file holds " + std::to_string(have) + " bytes after the " +
         std::to_string(header_bytes) + "-byte header" + (reader.cut_short() ? cut_note : ""));
  }
  reader.verify_end();

  content.hash = fnv1a64_bytes(header, header_bytes);
  content.hash = fnv1a64_bytes(content.payload.data(), content.payload.size(), content.hash);
  return content;
}

void write_idx(const std::string& path, uint32_t magic, const std::vector<uint32_t>& dims,
               const std::vector<uint8_t>& payload, bool gzip) {
  std::vector<uint8_t> bytes;
  put_big_endian_u32(magic, bytes);
  for (uint32_t dim : dims) put_big_endian_u32(dim, bytes);
  bytes.insert(bytes.end(), payload.begin(), payload.end());
  const auto fail = [&](const std::string& problem) { throw DataError(path + ": " + problem); };
  if (gzip) {
    gzFile file = gzopen(path.c_str(), "wb");
    if (!file) fail(std::string("cannot create: ") + std::strerror(errno));
    size_t written = 0;
    while (written < bytes.size()) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(bytes.size() - written, 1u << 30));
      if (gzwrite(file, bytes.data() + written, chunk) != static_cast<int>(chunk)) {
        gzclose(file);
        fail("gzwrite failed");
      }
      written += chunk;
    }
    if (gzclose(file) != Z_OK) fail("gzclose failed");
  } else {
    std::FILE* file = std::fopen(path.c_str(), "wb");
    if (!file) fail(std::string("cannot create: ") + std::strerror(errno));
    const size_t written = std::fwrite(bytes.data(), 1, bytes.size(), file);
    if (std::fclose(file) != 0 || written != bytes.size()) fail("write failed");
  }
}

uint32_t checked_dim(int64_t value, const std::string& path) {
  if (value < 0 || value > std::numeric_limits<uint32_t>::max()) {
    throw DataError(path + ": dimension " + std::to_string(value) + " does not fit an IDX header");
  }
  return static_cast<uint32_t>(value);
}

}  // namespace

IdxImages read_idx_images(const std::string& path) {
  IdxContent content = read_idx(path, kIdxImagesMagic);
  IdxImages images;
  images.count = content.dims[0];
  images.rows = content.dims[1];
  images.cols = content.dims[2];
  images.pixels = std::move(content.payload);
  images.content_hash = content.hash;
  return images;
}

IdxLabels read_idx_labels(const std::string& path, int64_t num_classes) {
  IdxContent content = read_idx(path, kIdxLabelsMagic);
  const auto bad = std::find_if(content.payload.begin(), content.payload.end(),
                                [&](uint8_t label) { return label >= num_classes; });
  if (bad != content.payload.end()) {
    throw DataError(path + ": label " + std::to_string(*bad) + " at index " +
                    std::to_string(bad - content.payload.begin()) + " is outside [0, " +
                    std::to_string(num_classes) + ")");
  }
  return IdxLabels{std::move(content.payload), content.hash};
}

void write_idx_images(const std::string& path, const IdxImages& images, bool gzip) {
  if (static_cast<int64_t>(images.pixels.size()) != images.count * images.rows * images.cols) {
    throw DataError(path + ": " + std::to_string(images.pixels.size()) + " pixels for " +
                    std::to_string(images.count) + " images of " + std::to_string(images.rows) + "x" +
                    std::to_string(images.cols));
  }
  write_idx(path, kIdxImagesMagic,
            {checked_dim(images.count, path), checked_dim(images.rows, path), checked_dim(images.cols, path)},
            images.pixels, gzip);
}

void write_idx_labels(const std::string& path, const std::vector<uint8_t>& labels, bool gzip) {
  write_idx(path, kIdxLabelsMagic, {checked_dim(static_cast<int64_t>(labels.size()), path)}, labels, gzip);
}

}  // namespace trainer
