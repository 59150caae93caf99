#pragma once
// Sequential reader of a file that may or may not be gzip-compressed, decided by its first two
// bytes (0x1f 0x8b), never by its name: datasets ship both ways and get renamed. Concatenated gzip
// members are read as one stream, like gzip -d does; bytes after the last member are ignored.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace trainer {

class GzipOrRawReader {
 public:
  // Throws DataError naming the path when it cannot be opened.
  explicit GzipOrRawReader(std::string path);
  ~GzipOrRawReader();
  GzipOrRawReader(const GzipOrRawReader&) = delete;
  GzipOrRawReader& operator=(const GzipOrRawReader&) = delete;

  const std::string& path() const { return path_; }
  bool is_gzip() const { return inflater_ != nullptr; }

  // Reads up to n (decompressed) bytes into out; returns fewer only at the end of the data. Throws
  // DataError on a corrupt gzip stream or a read error.
  size_t read(uint8_t* out, size_t n);

  // True when the data ended because the compressed stream was cut off, not at its end marker.
  bool cut_short() const { return cut_short_; }

  // Reads to the end of the current gzip member so that zlib checks its CRC and length: reading just
  // the bytes a caller needs would skip that check. Throws DataError when the stream is corrupt or
  // cut short. A no-op for an uncompressed file.
  void verify_end();

 private:
  struct Inflater;

  [[noreturn]] void fail(const std::string& problem) const;
  size_t inflate_into(uint8_t* out, size_t n, bool stop_at_member_end);
  void refill_input();

  std::string path_;
  std::FILE* file_ = nullptr;
  std::unique_ptr<Inflater> inflater_;
  std::vector<uint8_t> input_;  // compressed bytes read from the file, not yet inflated
  bool input_exhausted_ = false;
  bool member_ended_ = false;
  bool finished_ = false;  // no more members: the rest of the file, if any, is ignored
  bool cut_short_ = false;
};

}  // namespace trainer
