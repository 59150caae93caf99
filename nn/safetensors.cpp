#include "nn/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <stdexcept>
#include <string_view>

namespace trainer {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace {

// The reference implementation's limit; a larger header means a corrupt or foreign file.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr int kMaxJsonDepth = 16;

// ---------------------------------------------------------------------------------------------
// A small JSON reader and writer, enough for safetensors headers.

struct Json {
  enum class Kind { null, boolean, number, string, array, object } kind = Kind::null;
  bool boolean = false;
  std::string text;  // a string's value or a number's literal
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> members;  // in file order
};

const char* kind_name(Json::Kind kind) {
  switch (kind) {
    case Json::Kind::null:
      return "null";
    case Json::Kind::boolean:
      return "a boolean";
    case Json::Kind::number:
      return "a number";
    case Json::Kind::string:
      return "a string";
    case Json::Kind::array:
      return "an array";
    case Json::Kind::object:
      return "an object";
  }
  return "?";
}

struct JsonError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class JsonParser {
 public:
  explicit JsonParser(std::string_view text) : s_(text) {}

  Json parse_document() {
    Json value = parse_value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected characters after the top-level object");
    return value;
  }

 private:
  [[noreturn]] void fail(const std::string& message) const {
    std::string where = "bad header JSON at byte " + std::to_string(pos_) + ": " + message;
    if (!entry_.empty()) where += " (in the entry of tensor '" + entry_ + "')";
    throw JsonError(where);
  }

  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }

  char peek() {
    skip_ws();
    if (pos_ >= s_.size()) fail("unexpected end of header");
    return s_[pos_];
  }

  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "', found '" + s_[pos_] + "'");
    ++pos_;
  }

  Json parse_value(int depth) {
    if (depth > kMaxJsonDepth) fail("nesting deeper than " + std::to_string(kMaxJsonDepth));
    const char c = peek();
    Json v;
    if (c == '{') {
      v.kind = Json::Kind::object;
      ++pos_;
      if (peek() == '}') {
        ++pos_;
        return v;
      }
      std::set<std::string> seen;
      while (true) {
        if (peek() != '"') fail("expected a member name");
        std::string key = parse_string();
        if (!seen.insert(key).second) fail("duplicate key '" + key + "'");
        expect(':');
        if (depth == 0) entry_ = key;
        Json member = parse_value(depth + 1);
        v.members.emplace_back(std::move(key), std::move(member));
        const char next = peek();
        ++pos_;
        if (next == '}') break;
        if (next != ',') {
          --pos_;
          fail("expected ',' or '}'");
        }
      }
      if (depth == 0) entry_.clear();
    } else if (c == '[') {
      v.kind = Json::Kind::array;
      ++pos_;
      if (peek() == ']') {
        ++pos_;
        return v;
      }
      while (true) {
        v.items.push_back(parse_value(depth + 1));
        const char next = peek();
        ++pos_;
        if (next == ']') break;
        if (next != ',') {
          --pos_;
          fail("expected ',' or ']'");
        }
      }
    } else if (c == '"') {
      v.kind = Json::Kind::string;
      v.text = parse_string();
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind = Json::Kind::number;
      v.text = parse_number();
    } else if (s_.substr(pos_, 4) == "true") {
      v.kind = Json::Kind::boolean;
      v.boolean = true;
      pos_ += 4;
    } else if (s_.substr(pos_, 5) == "false") {
      v.kind = Json::Kind::boolean;
      pos_ += 5;
    } else if (s_.substr(pos_, 4) == "null") {
      pos_ += 4;
    } else {
      fail(std::string("unexpected character '") + c + "'");
    }
    return v;
  }

  std::string parse_number() {
    const size_t start = pos_;
    auto digits = [&] {
      const size_t from = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      return pos_ > from;
    };
    if (s_[pos_] == '-') ++pos_;
    if (pos_ < s_.size() && s_[pos_] == '0')
      ++pos_;
    else if (!digits())
      fail("malformed number");
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      if (!digits()) fail("malformed number");
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (!digits()) fail("malformed number");
    }
    return std::string(s_.substr(start, pos_ - start));
  }

  unsigned hex4() {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = s_[pos_++];
      v <<= 4;
      if (h >= '0' && h <= '9')
        v |= h - '0';
      else if (h >= 'a' && h <= 'f')
        v |= h - 'a' + 10;
      else if (h >= 'A' && h <= 'F')
        v |= h - 'A' + 10;
      else
        fail("bad hex digit in \\u escape");
    }
    return v;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string parse_string() {
    expect('"');
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) fail("unterminated string");
      const char c = s_[pos_++];
      if (c == '"') break;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) fail("unterminated string");
      const char e = s_[pos_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {
            if (s_.substr(pos_, 2) != "\\u") fail("unpaired surrogate in \\u escape");
            pos_ += 2;
            const unsigned low = hex4();
            if (low < 0xDC00 || low >= 0xE000) fail("unpaired surrogate in \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            fail("unpaired surrogate in \\u escape");
          }
          append_utf8(out, cp);
          break;
        }
        default:
          fail(std::string("bad escape '\\") + e + "'");
      }
    }
    return out;
  }

  std::string_view s_;
  size_t pos_ = 0;
  std::string entry_;  // the top-level key being parsed, for error messages
};

void write_json_string(std::string& out, const std::string& s) {
  out += '"';
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

// ---------------------------------------------------------------------------------------------
// Header model and validation.

struct Entry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

struct Header {
  std::vector<Entry> entries;  // sorted by data offset
  SafetensorsMetadata metadata;
  uint64_t data_start = 0;  // file offset of the data section
};

const std::pair<DType, const char*> kDTypeNames[] = {{DType::f32, "F32"}, {DType::f64, "F64"},
                                                     {DType::f16, "F16"}, {DType::bf16, "BF16"},
                                                     {DType::i64, "I64"}, {DType::u8, "U8"}};

[[noreturn]] void file_error(const std::string& path, const std::string& message) {
  throw std::runtime_error(path + ": " + message);
}

[[noreturn]] void tensor_error(const std::string& path, const std::string& name, const std::string& message) {
  throw std::runtime_error(path + ": tensor '" + name + "': " + message);
}

std::string offsets_str(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
}

uint64_t to_u64(const Json& v, const std::string& path, const std::string& name, const char* field) {
  uint64_t out = 0;
  if (v.kind == Json::Kind::number) {
    const char* first = v.text.data();
    const char* last = first + v.text.size();
    const auto [ptr, ec] = std::from_chars(first, last, out);
    if (ec == std::errc() && ptr == last) return out;
  }
  tensor_error(path, name,
               std::string(field) + " must hold non-negative integers, found " +
                   (v.kind == Json::Kind::number ? v.text : kind_name(v.kind)));
}

Entry parse_entry(const std::string& path, const std::string& name, const Json& v) {
  if (v.kind != Json::Kind::object)
    tensor_error(path, name, std::string("entry is ") + kind_name(v.kind) + ", expected an object");
  Entry e;
  e.name = name;
  bool has_dtype = false, has_shape = false, has_offsets = false;
  for (const auto& [key, field] : v.members) {
    if (key == "dtype") {
      if (field.kind != Json::Kind::string) tensor_error(path, name, "dtype must be a string");
      const auto* it = std::find_if(std::begin(kDTypeNames), std::end(kDTypeNames),
                                    [&](const auto& p) { return field.text == p.second; });
      if (it == std::end(kDTypeNames))
        tensor_error(path, name,
                     "unsupported dtype '" + field.text + "' (supported: F32, F64, F16, BF16, I64, U8)");
      e.dtype = it->first;
      has_dtype = true;
    } else if (key == "shape") {
      if (field.kind != Json::Kind::array) tensor_error(path, name, "shape must be an array");
      for (const Json& d : field.items) {
        const uint64_t n = to_u64(d, path, name, "shape");
        if (n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
          tensor_error(path, name, "dimension too large");
        e.shape.push_back(static_cast<int64_t>(n));
      }
      has_shape = true;
    } else if (key == "data_offsets") {
      if (field.kind != Json::Kind::array || field.items.size() != 2)
        tensor_error(path, name, "data_offsets must be an array of two integers [begin, end]");
      e.begin = to_u64(field.items[0], path, name, "data_offsets");
      e.end = to_u64(field.items[1], path, name, "data_offsets");
      has_offsets = true;
    } else {
      tensor_error(path, name, "unexpected field '" + key + "' (expected dtype, shape, data_offsets)");
    }
  }
  if (!has_dtype || !has_shape || !has_offsets)
    tensor_error(path, name,
                 std::string("missing field '") +
                     (!has_dtype   ? "dtype"
                      : !has_shape ? "shape"
                                   : "data_offsets") +
                     "'");
  if (e.end < e.begin)
    tensor_error(path, name, "data_offsets " + offsets_str(e.begin, e.end) + " end before they begin");
  uint64_t bytes = dtype_size(e.dtype);
  for (const int64_t d : e.shape)
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes))
      tensor_error(path, name, "shape " + shape_str(e.shape) + " is too large");
  if (e.end - e.begin != bytes)
    tensor_error(path, name,
                 "data_offsets " + offsets_str(e.begin, e.end) + " span " + std::to_string(e.end - e.begin) +
                     " bytes but shape " + shape_str(e.shape) + " of " + safetensors_dtype_name(e.dtype) +
                     " needs " + std::to_string(bytes));
  return e;
}

Header read_header(std::ifstream& in, const std::string& path) {
  std::error_code ec;
  const uint64_t file_size = std::filesystem::file_size(path, ec);
  if (ec) file_error(path, "cannot read the file size: " + ec.message());
  if (file_size < 8)
    file_error(path, "file has " + std::to_string(file_size) + " bytes, too few for a safetensors header");
  unsigned char len_bytes[8];
  if (!in.read(reinterpret_cast<char*>(len_bytes), 8)) file_error(path, "cannot read the header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > kMaxHeaderBytes)
    file_error(path, "header length " + std::to_string(header_len) + " exceeds the limit of " +
                         std::to_string(kMaxHeaderBytes) + " bytes (not a safetensors file?)");
  if (header_len > file_size - 8)
    file_error(path, "header length " + std::to_string(header_len) + " is larger than the " +
                         std::to_string(file_size - 8) + " bytes that follow it (truncated file?)");
  if (header_len < 2)
    file_error(path, "header of " + std::to_string(header_len) + " bytes cannot hold a JSON object");
  std::string text(header_len, '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(header_len)))
    file_error(path, "cannot read the header");

  Json root;
  try {
    root = JsonParser(text).parse_document();
  } catch (const JsonError& e) {
    file_error(path, e.what());
  }
  if (root.kind != Json::Kind::object)
    file_error(path, std::string("header is ") + kind_name(root.kind) + ", expected an object");

  Header h;
  h.data_start = 8 + header_len;
  for (const auto& [key, value] : root.members) {
    if (key == "__metadata__") {
      if (value.kind != Json::Kind::object) file_error(path, "__metadata__ must be an object of strings");
      for (const auto& [mk, mv] : value.members) {
        if (mv.kind != Json::Kind::string)
          file_error(path,
                     "__metadata__ value of '" + mk + "' is " + kind_name(mv.kind) + ", expected a string");
        h.metadata[mk] = mv.text;
      }
      continue;
    }
    h.entries.push_back(parse_entry(path, key, value));
  }

  // Tensors must tile the data section exactly, in any order: no overlap, no gap, nothing past the end
  // (the reference implementation's rules).
  const uint64_t body = file_size - h.data_start;
  for (const Entry& e : h.entries)
    if (e.end > body)
      tensor_error(path, e.name,
                   "data_offsets " + offsets_str(e.begin, e.end) +
                       " run past the end of the data section, which has " + std::to_string(body) +
                       " bytes (truncated file?)");
  std::stable_sort(h.entries.begin(), h.entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : h.entries) {
    if (e.begin < covered)
      tensor_error(path, e.name,
                   "data_offsets " + offsets_str(e.begin, e.end) + " overlap those of tensor '" +
                       previous->name + "' " + offsets_str(previous->begin, previous->end));
    if (e.begin > covered)
      tensor_error(path, e.name,
                   "data_offsets " + offsets_str(e.begin, e.end) +
                       " leave a gap: the data before it ends at byte " + std::to_string(covered));
    covered = e.end;
    previous = &e;
  }
  if (covered != body)
    file_error(path, "data section has " + std::to_string(body) + " bytes but the tensors cover only " +
                         std::to_string(covered) +
                         (previous ? " (the last one, tensor '" + previous->name + "', ends there)"
                                   : std::string()));
  return h;
}

// ---------------------------------------------------------------------------------------------
// Atomic file writing.

class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path) : path_(path) {
    tmp_ = path + ".tmp.XXXXXX";
    fd_ = ::mkstemp(tmp_.data());
    if (fd_ < 0) file_error(path_, std::string("cannot create a temporary file: ") + std::strerror(errno));
  }
  ~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t{1} << 30));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) file_error(path_, std::string("write failed: ") + std::strerror(errno));
      p += w;
      n -= static_cast<size_t>(w);
    }
  }

  void commit() {
    if (::fchmod(fd_, 0644) != 0) file_error(path_, std::string("chmod failed: ") + std::strerror(errno));
    if (::fsync(fd_) != 0) file_error(path_, std::string("fsync failed: ") + std::strerror(errno));
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) file_error(path_, std::string("close failed: ") + std::strerror(errno));
    if (::rename(tmp_.c_str(), path_.c_str()) != 0)
      file_error(path_, std::string("rename from ") + tmp_ + " failed: " + std::strerror(errno));
    committed_ = true;
    // Make the rename itself durable.
    std::string dir = std::filesystem::path(path_).parent_path().string();
    if (dir.empty()) dir = ".";
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace

std::string safetensors_dtype_name(DType dtype) {
  for (const auto& [d, name] : kDTypeNames)
    if (d == dtype) return name;
  return "?";
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const SafetensorsMetadata& metadata) {
  std::set<std::string> names;
  for (const auto& [name, t] : tensors) {
    if (name.empty() || name == "__metadata__") file_error(path, "invalid tensor name '" + name + "'");
    if (!names.insert(name).second) tensor_error(path, name, "appears twice");
    if (!t.defined()) tensor_error(path, name, "is undefined");
  }

  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      if (!first) header += ',';
      first = false;
      write_json_string(header, k);
      header += ':';
      write_json_string(header, v);
    }
    header += "}";
  }
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (header.size() > 1) header += ',';
    write_json_string(header, name);
    header += ":{\"dtype\":\"" + safetensors_dtype_name(t.dtype()) + "\",\"shape\":[";
    for (int d = 0; d < t.dim(); ++d) header += (d ? "," : "") + std::to_string(t.size(d));
    const uint64_t end = offset + t.nbytes();
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(end) + "]}";
    offset = end;
  }
  header += '}';
  // Pad with spaces so the data section starts 8-byte aligned, as the reference writer does.
  header.append((8 - header.size() % 8) % 8, ' ');

  AtomicFile file(path);
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i)
    len_bytes[i] = static_cast<unsigned char>(static_cast<uint64_t>(header.size()) >> (8 * i));
  file.write(len_bytes, 8);
  file.write(header.data(), header.size());
  for (const auto& [name, t] : tensors) {
    // One tensor at a time on the host, so saving a device model needs little host memory.
    Tensor host = (t.device().is_cpu() ? t : t.to(Device::cpu())).contiguous();
    if (host.nbytes() > 0) file.write(host.raw_data(), host.nbytes());
  }
  file.commit();
}

std::map<std::string, Tensor> load_safetensors(const std::string& path, SafetensorsMetadata* metadata) {
  std::ifstream in(path, std::ios::binary);
  if (!in) file_error(path, std::string("cannot open: ") + std::strerror(errno));
  Header h = read_header(in, path);
  std::map<std::string, Tensor> out;
  for (const Entry& e : h.entries) {  // in offset order, so the reads are sequential
    Tensor t = Tensor::empty(e.shape, e.dtype);
    if (t.nbytes() > 0) {
      in.seekg(static_cast<std::streamoff>(h.data_start + e.begin));
      if (!in.read(static_cast<char*>(t.raw_data()), static_cast<std::streamsize>(t.nbytes())))
        tensor_error(path, e.name, "cannot read its " + std::to_string(t.nbytes()) + " bytes of data");
    }
    out.emplace(e.name, std::move(t));
  }
  if (metadata) *metadata = std::move(h.metadata);
  return out;
}

void save_module(const std::string& path, Module& module, const SafetensorsMetadata& metadata) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const NamedTensor& nt : module.state_dict()) tensors.emplace_back(nt.name, *nt.tensor);
  save_safetensors(path, tensors, metadata);
}

namespace {

// A BatchNorm step counter: a scalar i64 buffer named "num_batches_tracked" (torchvision's name).
bool is_step_counter(const NamedTensor& nt) {
  static const std::string kName = "num_batches_tracked";
  const std::string& n = nt.name;
  const bool named = n == kName || (n.size() > kName.size() && n.ends_with("." + kName));
  return named && nt.tensor->dtype() == DType::i64 && nt.tensor->numel() == 1;
}

}  // namespace

std::string ModuleLoadReport::note(const std::string& path) const {
  if (counters_set_to_zero.empty()) return "";
  return path + ": " + std::to_string(counters_set_to_zero.size()) +
         " BatchNorm num_batches_tracked counter(s) missing from the file (as in torchvision exports), set "
         "to 0; first: " +
         counters_set_to_zero.front();
}

ModuleLoadReport load_module(const std::string& path, Module& module) {
  std::map<std::string, Tensor> file = load_safetensors(path);
  const std::vector<NamedTensor> state = module.state_dict();

  // Check everything before touching the module, so a failed load leaves it as it was.
  ModuleLoadReport report;
  std::set<std::string> expected;
  for (const NamedTensor& nt : state) {
    expected.insert(nt.name);
    const auto it = file.find(nt.name);
    if (it == file.end() && is_step_counter(nt)) {
      report.counters_set_to_zero.push_back(nt.name);
      continue;
    }
    if (it == file.end())
      tensor_error(path, nt.name,
                   "missing from the file (the model has " + std::to_string(state.size()) +
                       " tensors, the file " + std::to_string(file.size()) + ")");
    const Tensor& src = it->second;
    if (src.dtype() != nt.tensor->dtype())
      tensor_error(path, nt.name,
                   "dtype " + safetensors_dtype_name(src.dtype()) + " in file, " +
                       safetensors_dtype_name(nt.tensor->dtype()) + " in model");
    if (src.shape() != nt.tensor->shape())
      tensor_error(
          path, nt.name,
          "shape " + shape_str(src.shape()) + " in file, " + shape_str(nt.tensor->shape()) + " in model");
  }
  for (const auto& [name, t] : file)
    if (!expected.count(name))
      tensor_error(path, name, "in the file but not in the model (unexpected tensor)");

  for (const NamedTensor& nt : state) {
    const auto it = file.find(nt.name);
    if (it == file.end())
      nt.tensor->fill_(0.0);  // a step counter (checked above)
    else
      nt.tensor->copy_(it->second);
  }
  return report;
}

}  // namespace trainer
