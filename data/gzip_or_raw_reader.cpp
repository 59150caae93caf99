#include "data/gzip_or_raw_reader.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>

#include "data/data_error.h"

namespace trainer {

namespace {
constexpr size_t kInputChunk = size_t{1} << 18;
constexpr uint8_t kGzipMagic0 = 0x1f, kGzipMagic1 = 0x8b;
}  // namespace

struct GzipOrRawReader::Inflater {
  z_stream stream{};
};

GzipOrRawReader::GzipOrRawReader(std::string path) : path_(std::move(path)) {
  file_ = std::fopen(path_.c_str(), "rb");
  if (!file_) fail(std::string("cannot open: ") + std::strerror(errno));
  uint8_t magic[2] = {0, 0};
  const size_t got = std::fread(magic, 1, 2, file_);
  if (got == 2 && magic[0] == kGzipMagic0 && magic[1] == kGzipMagic1) {
    inflater_ = std::make_unique<Inflater>();
    // 16 + MAX_WBITS: expect a gzip wrapper (header, CRC-32 and length trailer), not raw zlib.
    if (inflateInit2(&inflater_->stream, 16 + MAX_WBITS) != Z_OK) {
      inflater_.reset();
      fail("zlib inflateInit2 failed");
    }
    input_.assign(magic, magic + 2);
    inflater_->stream.next_in = input_.data();
    inflater_->stream.avail_in = 2;
  } else {
    // Uncompressed: start again from the first byte.
    if (std::fseek(file_, 0, SEEK_SET) != 0) fail(std::string("cannot seek: ") + std::strerror(errno));
  }
}

GzipOrRawReader::~GzipOrRawReader() {
  if (inflater_) inflateEnd(&inflater_->stream);
  if (file_) std::fclose(file_);
}

void GzipOrRawReader::fail(const std::string& problem) const { throw DataError(path_ + ": " + problem); }

size_t GzipOrRawReader::read(uint8_t* out, size_t n) {
  if (!inflater_) {
    const size_t got = std::fread(out, 1, n, file_);
    if (got < n && std::ferror(file_)) fail(std::string("read error: ") + std::strerror(errno));
    return got;
  }
  return inflate_into(out, n, /*stop_at_member_end=*/false);
}

void GzipOrRawReader::verify_end() {
  if (!inflater_) return;
  uint8_t discard[1 << 14];
  while (!finished_ && !member_ended_) inflate_into(discard, sizeof(discard), /*stop_at_member_end=*/true);
  if (cut_short_) fail("truncated gzip stream: the file ends before the stream's end marker and CRC");
}

void GzipOrRawReader::refill_input() {
  // Move the bytes zlib has not consumed yet to the front, then append fresh ones from the file.
  z_stream& z = inflater_->stream;
  const size_t kept = z.avail_in;
  if (kept > 0) std::memmove(input_.data(), z.next_in, kept);
  input_.resize(kept + kInputChunk);
  const size_t got = std::fread(input_.data() + kept, 1, kInputChunk, file_);
  if (got < kInputChunk && std::ferror(file_)) fail(std::string("read error: ") + std::strerror(errno));
  if (got == 0) input_exhausted_ = true;
  input_.resize(kept + got);
  z.next_in = input_.data();
  z.avail_in = static_cast<uInt>(input_.size());
}

size_t GzipOrRawReader::inflate_into(uint8_t* out, size_t n, bool stop_at_member_end) {
  z_stream& z = inflater_->stream;
  size_t produced = 0;
  while (produced < n && !finished_) {
    if (member_ended_) {
      if (stop_at_member_end) break;
      // Another member follows only if the next bytes are a gzip header; anything else is trailing
      // garbage (padding from tape-era tools, for instance), which gzip -d also ignores.
      if (z.avail_in < 2 && !input_exhausted_) refill_input();
      if (z.avail_in >= 2 && z.next_in[0] == kGzipMagic0 && z.next_in[1] == kGzipMagic1) {
        inflateReset(&z);
        member_ended_ = false;
      } else {
        finished_ = true;
        break;
      }
    }
    if (z.avail_in == 0) {
      if (input_exhausted_) {
        cut_short_ = true;
        finished_ = true;
        break;
      }
      refill_input();
      continue;
    }
    const size_t want = std::min<size_t>(n - produced, size_t{1} << 30);
    z.next_out = out + produced;
    z.avail_out = static_cast<uInt>(want);
    const int status = inflate(&z, Z_NO_FLUSH);
    produced += want - z.avail_out;
    switch (status) {
      case Z_OK:
      case Z_BUF_ERROR:  // no progress possible without more input: the loop refills
        break;
      case Z_STREAM_END:
        member_ended_ = true;
        break;
      case Z_MEM_ERROR:
        fail("out of memory while decompressing");
      default:  // Z_DATA_ERROR, Z_NEED_DICT, Z_STREAM_ERROR
        fail(std::string("corrupt gzip stream: ") +
             (z.msg ? z.msg : "inflate error " + std::to_string(status)));
    }
  }
  return produced;
}

}  // namespace trainer
