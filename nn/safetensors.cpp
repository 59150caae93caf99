#include "nn/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

#include "nn/file_error_hint.h"

namespace trainer {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace {

// The reference implementation's limit; a larger header means a corrupt or foreign file.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr int kMaxJsonDepth = 16;

// ---------------------------------------------------------------------------------------------
// The header's JSON, through nlohmann-json. Objects read into std::map (the order of a file's entries
// does not matter: they are sorted by offset); the writer uses ordered_json to keep the caller's order.

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

// Thrown by the parse callback: what nlohmann-json would accept but a header must not hold.
struct HeaderJsonError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

const char* kind_name(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
    case Json::value_t::number_float:
      return "a number";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::object:
      return "an object";
    default:
      return "binary data";
  }
}

// nlohmann-json's message without its "[json.exception.parse_error.101] " prefix.
std::string library_message(const Json::exception& e) {
  const std::string m = e.what();
  const size_t end = m.rfind(']', m.find(' '));
  return m.rfind("[json.exception.", 0) == 0 && end != std::string::npos ? m.substr(end + 2) : m;
}

// Parses a header, refusing two things nlohmann-json's defaults let through. A key twice in one
// object: the library keeps the last silently, and a tensor named twice is ambiguous. Nesting deeper
// than kMaxJsonDepth: a header needs three levels, and the check runs as each level opens, so a
// hostile 100000-deep header is refused at level kMaxJsonDepth (the parser itself keeps its stack on
// the heap, but nothing downstream should walk such a tree). Errors name the top-level entry being read.
Json parse_header_json(const std::string& text) {
  std::vector<std::set<std::string>> keys_of_open_objects;
  std::string entry;  // the top-level key whose value is being read
  auto check = [&](int depth, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        if (depth >= kMaxJsonDepth)
          throw HeaderJsonError("nesting deeper than " + std::to_string(kMaxJsonDepth) + " levels");
        if (event == Json::parse_event_t::object_start) keys_of_open_objects.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        keys_of_open_objects.pop_back();
        if (depth == 0) entry.clear();
        break;
      case Json::parse_event_t::key: {
        const std::string& key = parsed.get_ref<const std::string&>();
        if (depth == 1) entry = key;
        if (!keys_of_open_objects.back().insert(key).second)
          throw HeaderJsonError("duplicate key '" + key + "'");
        break;
      }
      default:
        break;
    }
    return true;  // keep every value
  };
  std::string message;
  try {
    return Json::parse(text, check);
  } catch (const HeaderJsonError& e) {
    message = e.what();
  } catch (const Json::exception& e) {
    message = library_message(e);
  }
  message = "bad header JSON: " + message;
  if (entry == "__metadata__")
    message += " (in __metadata__)";
  else if (!entry.empty())
    message += " (in the entry of tensor '" + entry + "')";
  throw HeaderJsonError(message);
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

// A failed system call while writing `path`: `what`, errno's text and what to do about it.
[[noreturn]] void write_error(const std::string& path, const std::string& what) {
  const int error = errno;
  file_error(path, what + ": " + std::strerror(error) + ". HINT: " + file_error_hint(error));
}

[[noreturn]] void tensor_error(const std::string& path, const std::string& name, const std::string& message) {
  throw std::runtime_error(path + ": tensor '" + name + "': " + message);
}

std::string offsets_str(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
}

uint64_t to_u64(const Json& v, const std::string& path, const std::string& name, const char* field) {
  // nlohmann-json reads a non-negative integer literal as unsigned (all but "-0"); negative ones,
  // fractions and integers past uint64 (read as floating point) are refused here.
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() == 0) return 0;  // "-0"
  tensor_error(path, name,
               std::string(field) + " must hold non-negative integers, found " +
                   (v.is_number() ? v.dump() : kind_name(v)));
}

Entry parse_entry(const std::string& path, const std::string& name, const Json& v) {
  if (!v.is_object())
    tensor_error(path, name, std::string("entry is ") + kind_name(v) + ", expected an object");
  Entry e;
  e.name = name;
  bool has_dtype = false, has_shape = false, has_offsets = false;
  for (const auto& [key, field] : v.items()) {
    if (key == "dtype") {
      if (!field.is_string()) tensor_error(path, name, "dtype must be a string");
      const std::string& text = field.get_ref<const std::string&>();
      const auto* it = std::find_if(std::begin(kDTypeNames), std::end(kDTypeNames),
                                    [&](const auto& p) { return text == p.second; });
      if (it == std::end(kDTypeNames))
        tensor_error(path, name,
                     "unsupported dtype '" + text + "' (supported: F32, F64, F16, BF16, I64, U8)");
      e.dtype = it->first;
      has_dtype = true;
    } else if (key == "shape") {
      if (!field.is_array()) tensor_error(path, name, "shape must be an array");
      for (const Json& d : field) {
        const uint64_t n = to_u64(d, path, name, "shape");
        if (n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
          tensor_error(path, name, "dimension too large");
        e.shape.push_back(static_cast<int64_t>(n));
      }
      has_shape = true;
    } else if (key == "data_offsets") {
      if (!field.is_array() || field.size() != 2)
        tensor_error(path, name, "data_offsets must be an array of two integers [begin, end]");
      e.begin = to_u64(field[0], path, name, "data_offsets");
      e.end = to_u64(field[1], path, name, "data_offsets");
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
    root = parse_header_json(text);
  } catch (const HeaderJsonError& e) {
    file_error(path, e.what());
  }
  if (!root.is_object())
    file_error(path, std::string("header is ") + kind_name(root) + ", expected an object");

  Header h;
  h.data_start = 8 + header_len;
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) file_error(path, "__metadata__ must be an object of strings");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string())
          file_error(path, "__metadata__ value of '" + mk + "' is " + kind_name(mv) + ", expected a string");
        h.metadata[mk] = mv.get<std::string>();
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
    if (fd_ < 0) write_error(path_, "cannot create a temporary file");
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
      if (w < 0) write_error(path_, "write failed");
      p += w;
      n -= static_cast<size_t>(w);
    }
  }

  void commit() {
    if (::fchmod(fd_, 0644) != 0) write_error(path_, "chmod failed");
    if (::fsync(fd_) != 0) write_error(path_, "fsync failed");
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) write_error(path_, "close failed");
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) write_error(path_, "rename from " + tmp_ + " failed");
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

  // __metadata__ first (its keys sorted), then the tensors in the given order: the layout files had
  // before the header went through nlohmann-json, byte for byte.
  OrderedJson json = OrderedJson::object();
  if (!metadata.empty()) json["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    OrderedJson shape = OrderedJson::array();
    for (int d = 0; d < t.dim(); ++d) shape.push_back(t.size(d));
    const uint64_t end = offset + t.nbytes();
    OrderedJson entry = OrderedJson::object();
    entry["dtype"] = safetensors_dtype_name(t.dtype());
    entry["shape"] = std::move(shape);
    entry["data_offsets"] = OrderedJson::array({offset, end});
    json[name] = std::move(entry);
    offset = end;
  }
  std::string header;
  try {
    header = json.dump();
  } catch (const OrderedJson::type_error& e) {  // a name or metadata string that is not UTF-8
    file_error(path, "cannot write the header: " + library_message(e) +
                         " (tensor names and metadata must be valid UTF-8)");
  }
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

SafetensorsFile read_safetensors(const std::string& path) {
  SafetensorsFile file;
  file.path = path;
  file.tensors = load_safetensors(path, &file.metadata);
  return file;
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
  std::string note;
  if (!counters_set_to_zero.empty())
    note = path + ": " + std::to_string(counters_set_to_zero.size()) +
           " BatchNorm num_batches_tracked counter(s) missing from the file (as in torchvision exports), set "
           "to 0; first: " +
           counters_set_to_zero.front();
  for (const std::string& line : adapted)
    note += (note.empty() ? "" : "\n") + path + ": resized to this model (bicubic, as torchvision): " + line;
  return note;
}

ModuleLoadReport load_module(const std::string& path, Module& module) {
  return load_module(read_safetensors(path), module);
}

ModuleLoadReport load_module(SafetensorsFile read, Module& module) {
  const std::string& path = read.path;
  std::map<std::string, Tensor>& file = read.tensors;  // adapted tensors replace their entries
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
    if (src.shape() != nt.tensor->shape()) {
      std::optional<Tensor> fitted = module.adapt_loaded_tensor(nt.name, src);
      if (!fitted || fitted->shape() != nt.tensor->shape() || fitted->dtype() != nt.tensor->dtype())
        tensor_error(
            path, nt.name,
            "shape " + shape_str(src.shape()) + " in file, " + shape_str(nt.tensor->shape()) + " in model");
      report.adapted.push_back(nt.name + " " + shape_str(src.shape()) + " -> " +
                               shape_str(nt.tensor->shape()));
      it->second = std::move(*fitted);
    }
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
