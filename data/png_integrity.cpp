#include "data/png_integrity.h"

#include <zlib.h>

#include <cstring>
#include <string>

#include "data/image_codec.h"

namespace trainer {

namespace {

constexpr size_t kSignatureBytes = 8;

uint32_t read_be32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | uint32_t{p[3]};
}

// An upper-case first letter marks a chunk the pixels depend on; ancillary chunks (text, gamma, ...)
// are not used by decode_image, and libspng ignores their CRC too.
bool is_critical(const uint8_t* type) { return (type[0] & 0x20) == 0; }

std::string chunk_name(const uint8_t* type) { return std::string(reinterpret_cast<const char*>(type), 4); }

// Inflates the concatenated IDAT data into a scratch buffer that is thrown away: only the end of the
// stream and its checksum matter here.
class IdatStream {
 public:
  IdatStream() {
    if (inflateInit(&stream_) != Z_OK) throw ImageDecodeError("zlib: cannot initialise an inflate stream");
  }
  ~IdatStream() { inflateEnd(&stream_); }
  IdatStream(const IdatStream&) = delete;
  IdatStream& operator=(const IdatStream&) = delete;

  // Feeds one IDAT chunk's data. Returns what went wrong, or "". Bytes after the stream's end are
  // ignored, as libpng and PIL do.
  std::string feed(const uint8_t* data, size_t size) {
    if (ended_) return "";
    stream_.next_in = const_cast<Bytef*>(data);
    stream_.avail_in = static_cast<uInt>(size);
    while (stream_.avail_in > 0 && !ended_) {
      stream_.next_out = scratch_;
      stream_.avail_out = sizeof scratch_;
      const int rc = inflate(&stream_, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) {
        ended_ = true;
      } else if (rc != Z_OK && !(rc == Z_BUF_ERROR && stream_.avail_in == 0)) {
        return std::string("its compressed pixel data is damaged (zlib: ") +
               (stream_.msg ? stream_.msg : "error " + std::to_string(rc)) + ")";
      }
    }
    return "";
  }
  bool ended() const { return ended_; }

 private:
  z_stream stream_{};
  Bytef scratch_[1 << 15];
  bool ended_ = false;
};

}  // namespace

void check_png_integrity(const uint8_t* data, size_t size) {
  const std::string bytes_note = " (" + std::to_string(size) + " bytes)";
  IdatStream idat;
  bool seen_idat = false;
  for (size_t at = kSignatureBytes; at < size;) {
    if (size - at < 12) throw ImageDecodeError("truncated PNG: a chunk header is cut short" + bytes_note);
    const uint32_t length = read_be32(data + at);
    const uint8_t* type = data + at + 4;
    if (length > size - at - 12) {
      throw ImageDecodeError("truncated PNG: chunk " + chunk_name(type) + " at byte " + std::to_string(at) +
                             " is cut short" + bytes_note);
    }
    const uint8_t* body = type + 4;
    if (is_critical(type)) {
      const uint32_t stored = read_be32(body + length);
      const uint32_t computed = static_cast<uint32_t>(crc32(crc32(0, nullptr, 0), type, length + 4));
      if (stored != computed) {
        throw ImageDecodeError("corrupt PNG: the CRC of chunk " + chunk_name(type) + " at byte " +
                               std::to_string(at) + " does not match its contents" + bytes_note);
      }
    }
    if (std::memcmp(type, "IDAT", 4) == 0) {
      seen_idat = true;
      const std::string problem = idat.feed(body, length);
      if (!problem.empty()) throw ImageDecodeError("corrupt PNG: " + problem + bytes_note);
    }
    if (std::memcmp(type, "IEND", 4) == 0) break;
    at += size_t{length} + 12;
  }
  if (!seen_idat) throw ImageDecodeError("truncated PNG: no IDAT (pixel data) chunk" + bytes_note);
  if (!idat.ended()) {
    throw ImageDecodeError("truncated PNG: its compressed pixel data ends before the image does" +
                           bytes_note);
  }
}

}  // namespace trainer
