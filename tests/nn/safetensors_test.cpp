#include "nn/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "nn/models/registry.h"
#include "nn/modules/layers.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("trainer_safetensors_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

std::vector<uint8_t> bytes_of(const Tensor& t) {
  std::vector<uint8_t> out(t.nbytes());
  if (!out.empty()) std::memcpy(out.data(), t.contiguous().raw_data(), out.size());
  return out;
}

Tensor raw_tensor(const Shape& shape, DType dtype, const std::vector<uint8_t>& bytes) {
  Tensor t = Tensor::empty(shape, dtype);
  EXPECT_EQ(bytes.size(), t.nbytes());
  if (!bytes.empty()) std::memcpy(t.raw_data(), bytes.data(), bytes.size());
  return t;
}

// Writes a file from a literal header and body; header_len overrides the length field.
void write_raw(const std::string& path, const std::string& header, const std::vector<uint8_t>& body,
               uint64_t header_len = UINT64_MAX) {
  if (header_len == UINT64_MAX) header_len = header.size();
  std::ofstream out(path, std::ios::binary);
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(header_len >> (8 * i)));
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(body.data()), static_cast<std::streamsize>(body.size()));
}

// The error message of `f`, which must throw std::runtime_error.
template <class Fn>
std::string error_of(Fn f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a std::runtime_error";
  return "";
}

#define EXPECT_MENTIONS(message, text) \
  EXPECT_NE((message).find(text), std::string::npos) << "message: " << (message) << "\nmissing: " << (text)

TEST_F(Safetensors, RoundTripIsBitExactForEveryDtype) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  // f32 with signed zero, infinities, a NaN payload and a denormal, kept bit for bit.
  std::vector<uint32_t> f32_bits = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,
                                    0x7fc12345u, 0x00000001u, 0x3f800000u, 0xc0490fdbu};
  std::vector<uint8_t> f32(f32_bits.size() * 4);
  std::memcpy(f32.data(), f32_bits.data(), f32.size());
  tensors.emplace_back("f32", raw_tensor({2, 4}, DType::f32, f32));
  tensors.emplace_back("f64", Tensor::from_vector<double>({1.0 / 3, -0.0, 1e308, 5e-324, -2.5, 7.0}, {3, 2}));
  // Every 16-bit pattern for both half types.
  std::vector<uint8_t> all16(65536 * 2);
  for (uint32_t i = 0; i < 65536; ++i) all16[2 * i] = i & 0xff, all16[2 * i + 1] = i >> 8;
  tensors.emplace_back("f16", raw_tensor({256, 256}, DType::f16, all16));
  tensors.emplace_back("bf16", raw_tensor({65536}, DType::bf16, all16));
  tensors.emplace_back(
      "i64", Tensor::from_vector<int64_t>(
                 {std::numeric_limits<int64_t>::min(), -1, 0, 1, std::numeric_limits<int64_t>::max()}, {5}));
  std::vector<uint8_t> u8(256);
  for (int i = 0; i < 256; ++i) u8[i] = static_cast<uint8_t>(i);
  tensors.emplace_back("u8", Tensor::from_vector<uint8_t>(u8, {16, 16}));
  tensors.emplace_back("empty", Tensor::empty({0, 3}, DType::f32));
  tensors.emplace_back("scalar", Tensor::scalar(42, DType::i64));
  tensors.emplace_back("name with \"quotes\", \\ and \xc3\xa9", Tensor::ones({1}, DType::bf16));

  const SafetensorsMetadata metadata = {{"format", "pt"},
                                        {"note", "line\nbreak \"quoted\" \x01 \xe2\x82\xac"}};
  save_safetensors(path("all.safetensors"), tensors, metadata);
  SafetensorsMetadata read_metadata;
  const auto loaded = load_safetensors(path("all.safetensors"), &read_metadata);
  EXPECT_EQ(read_metadata, metadata);
  ASSERT_EQ(loaded.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(loaded.count(name)) << name;
    const Tensor& r = loaded.at(name);
    EXPECT_EQ(r.dtype(), t.dtype()) << name;
    EXPECT_EQ(r.shape(), t.shape()) << name;
    EXPECT_EQ(bytes_of(r), bytes_of(t)) << name;
  }
  // No temp files left behind; the data section starts 8-byte aligned.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
  std::ifstream in(path("all.safetensors"), std::ios::binary);
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  EXPECT_EQ(header_len % 8, 0u);
}

TEST_F(Safetensors, HeaderIsStandardJsonInTheGivenOrder) {
  save_safetensors(path("w.safetensors"),
                   {{"b", Tensor::zeros({2}, DType::f32)}, {"a", Tensor::zeros({1, 1}, DType::u8)}});
  std::ifstream in(path("w.safetensors"), std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  EXPECT_EQ(header.substr(0, header.find_last_not_of(' ') + 1),
            R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("a":{"dtype":"U8","shape":[1,1],"data_offsets":[8,9]}})");
}

TEST_F(Safetensors, NonContiguousTensorsAreSavedContiguous) {
  Tensor t = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}).permute({1, 0});  // [3, 2]
  ASSERT_FALSE(t.is_contiguous());
  save_safetensors(path("t.safetensors"), {{"t", t}});
  const auto loaded = load_safetensors(path("t.safetensors"));
  EXPECT_EQ(loaded.at("t").shape(), (Shape{3, 2}));
  EXPECT_EQ(loaded.at("t").to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
}

TEST_F(Safetensors, SaveReplacesAnExistingFileAndRefusesBadNames) {
  save_safetensors(path("x.safetensors"), {{"a", Tensor::ones({3})}});
  save_safetensors(path("x.safetensors"), {{"b", Tensor::ones({2})}});
  EXPECT_EQ(load_safetensors(path("x.safetensors")).count("b"), 1u);
  EXPECT_THROW(save_safetensors(path("y.safetensors"), {{"a", Tensor::ones({1})}, {"a", Tensor::ones({1})}}),
               std::runtime_error);
  EXPECT_THROW(save_safetensors(path("y.safetensors"), {{"__metadata__", Tensor::ones({1})}}),
               std::runtime_error);
  EXPECT_FALSE(fs::exists(path("y.safetensors")));
  EXPECT_THROW(save_safetensors(path("no/such/dir/z.safetensors"), {{"a", Tensor::ones({1})}}),
               std::runtime_error);
}

TEST_F(Safetensors, ModuleRoundTrip) {
  ModelOptions o;
  o.name = "cnn";
  o.in_channels = 1;
  o.image_size = 28;
  o.seed = 1;
  auto a = create_model(o);
  // Make the buffers non-trivial.
  for (auto& nt : a->state_dict())
    if (nt.is_buffer) nt.tensor->fill_(nt.name.find("num_batches") != std::string::npos ? 17 : 0.5);
  save_module(path("cnn.safetensors"), *a, {{"step", "17"}});
  o.seed = 2;
  auto b = create_model(o);
  load_module(path("cnn.safetensors"), *b);
  const auto sa = a->state_dict(), sb = b->state_dict();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].name, sb[i].name);
    EXPECT_EQ(bytes_of(*sa[i].tensor), bytes_of(*sb[i].tensor)) << sa[i].name;
  }
  const auto file = load_safetensors(path("cnn.safetensors"));
  EXPECT_EQ(file.at("bn1.num_batches_tracked").dtype(), DType::i64);
  EXPECT_EQ(file.at("bn1.num_batches_tracked").item(), 17.0);
}

// ---- malformed files: each names the file and, where one is involved, the tensor.

// A small module with a parameter, a child and buffers: 0.weight [3, 4], 0.bias [3], 1.* (BN of 3).
std::shared_ptr<Sequential> small_module() {
  Generator gen(0);
  return std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
      std::make_shared<Linear>(4, 3, true, gen), std::make_shared<BatchNorm2d>(3)});
}

std::vector<std::pair<std::string, Tensor>> state_of(Module& m) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& nt : m.state_dict()) out.emplace_back(nt.name, *nt.tensor);
  return out;
}

TEST_F(Safetensors, TruncatedBodyNamesTheTensor) {
  save_safetensors(path("t.safetensors"), {{"w", Tensor::ones({4})}, {"b", Tensor::ones({2})}});
  fs::resize_file(path("t.safetensors"), fs::file_size(path("t.safetensors")) - 3);
  const std::string msg = error_of([&] { load_safetensors(path("t.safetensors")); });
  EXPECT_MENTIONS(msg, "t.safetensors");
  EXPECT_MENTIONS(msg, "tensor 'b'");
  EXPECT_MENTIONS(msg, "truncated");
}

TEST_F(Safetensors, HeaderLongerThanTheFile) {
  write_raw(path("h.safetensors"), R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", {0, 0, 0, 0},
            1000);
  const std::string msg = error_of([&] { load_safetensors(path("h.safetensors")); });
  EXPECT_MENTIONS(msg, "h.safetensors");
  EXPECT_MENTIONS(msg, "header length 1000");
  // The header cannot be read, so no tensor can be named.
}

TEST_F(Safetensors, OversizedHeader) {
  write_raw(path("o.safetensors"), "{}", {}, uint64_t{1} << 40);
  const std::string msg = error_of([&] { load_safetensors(path("o.safetensors")); });
  EXPECT_MENTIONS(msg, "o.safetensors");
  EXPECT_MENTIONS(msg, "exceeds the limit");
}

TEST_F(Safetensors, TooShortForTheLengthField) {
  write_raw(path("s.safetensors"), "", {});
  fs::resize_file(path("s.safetensors"), 5);
  EXPECT_MENTIONS(error_of([&] { load_safetensors(path("s.safetensors")); }), "s.safetensors");
  EXPECT_MENTIONS(error_of([&] { load_safetensors(path("missing.safetensors")); }), "missing.safetensors");
}

TEST_F(Safetensors, BadJsonNamesTheEntryBeingParsed) {
  write_raw(path("j.safetensors"),
            R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32" "shape":[1]}})",
            std::vector<uint8_t>(8));
  const std::string msg = error_of([&] { load_safetensors(path("j.safetensors")); });
  EXPECT_MENTIONS(msg, "j.safetensors");
  EXPECT_MENTIONS(msg, "bad header JSON");
  EXPECT_MENTIONS(msg, "tensor 'b'");
  for (const char* header :
       {"{", "[]", R"({"a":1,"a":2})", R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}} x)",
        "{\"w\":\"\x01\"}", R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",
        R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})"}) {
    write_raw(path("j.safetensors"), header, std::vector<uint8_t>(4));
    EXPECT_MENTIONS(error_of([&] { load_safetensors(path("j.safetensors")); }), "j.safetensors");
  }
}

TEST_F(Safetensors, OverlappingOffsets) {
  write_raw(
      path("v.safetensors"),
      R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
      std::vector<uint8_t>(12));
  const std::string msg = error_of([&] { load_safetensors(path("v.safetensors")); });
  EXPECT_MENTIONS(msg, "v.safetensors");
  EXPECT_MENTIONS(msg, "tensor 'b'");
  EXPECT_MENTIONS(msg, "overlap");
  EXPECT_MENTIONS(msg, "'w'");
}

TEST_F(Safetensors, InconsistentEntries) {
  struct Case {
    const char* header;
    size_t body;
    const char* says;
  };
  const Case cases[] = {
      {R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, "needs 12"},
      {R"({"w":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})", 8, "unsupported dtype 'I32'"},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8, "end before they begin"},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12, "gap"},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8 + 4, "cover only 8"},
      {R"({"w":{"dtype":"F32","shape":[2]}})", 8, "missing field 'data_offsets'"},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1}})", 8, "unexpected field 'extra'"},
      {R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})", 8, "too large"},
  };
  for (const Case& c : cases) {
    write_raw(path("c.safetensors"), c.header, std::vector<uint8_t>(c.body));
    const std::string msg = error_of([&] { load_safetensors(path("c.safetensors")); });
    EXPECT_MENTIONS(msg, "c.safetensors");
    EXPECT_MENTIONS(msg, c.says);
    EXPECT_MENTIONS(msg, "tensor 'w'");
  }
}

// ---- the on-disk format: files written before the header went through nlohmann-json still load.

// The bytes the writer produced before (our own JSON writer): __metadata__ first with its keys sorted,
// then the tensors in the order given, compact JSON, spaces up to a multiple of 8 bytes.
const std::string kGoldenHeader = R"({"__metadata__":{"format":"pt","step":"17"},)"
                                  R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                  R"("a":{"dtype":"U8","shape":[1,1],"data_offsets":[8,9]},)"
                                  R"("n\"q":{"dtype":"I64","shape":[],"data_offsets":[9,17]}} )";
const std::vector<uint8_t> kGoldenBody = {0,    0,    0xc0, 0x3f, 0,    0,    0,    0xc0,   // 1.5f, -2.0f
                                          7,                                                // u8 7
                                          0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};  // -2

std::vector<std::pair<std::string, Tensor>> golden_tensors() {
  return {{"b", Tensor::from_vector<float>({1.5f, -2.0f}, {2})},
          {"a", Tensor::from_vector<uint8_t>({7}, {1, 1})},
          {"n\"q", Tensor::scalar(-2, DType::i64)}};
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST_F(Safetensors, FileWrittenBeforeTheJsonLibraryStillLoads) {
  ASSERT_EQ(kGoldenHeader.size() % 8, 0u);
  write_raw(path("old.safetensors"), kGoldenHeader, kGoldenBody);
  SafetensorsMetadata metadata;
  const auto loaded = load_safetensors(path("old.safetensors"), &metadata);
  EXPECT_EQ(metadata, (SafetensorsMetadata{{"format", "pt"}, {"step", "17"}}));
  ASSERT_EQ(loaded.size(), 3u);
  EXPECT_EQ(loaded.at("b").to_vector<float>(), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(loaded.at("a").shape(), (Shape{1, 1}));
  EXPECT_EQ(loaded.at("a").to_vector<uint8_t>(), (std::vector<uint8_t>{7}));
  EXPECT_EQ(loaded.at("n\"q").shape(), Shape{});
  EXPECT_EQ(loaded.at("n\"q").item(), -2.0);
}

TEST_F(Safetensors, WriterKeepsTheOnDiskFormatByteForByte) {
  save_safetensors(path("new.safetensors"), golden_tensors(), {{"step", "17"}, {"format", "pt"}});
  std::string expected(8, '\0');
  for (int i = 0; i < 8; ++i) expected[i] = static_cast<char>(kGoldenHeader.size() >> (8 * i));
  expected += kGoldenHeader;
  expected.append(kGoldenBody.begin(), kGoldenBody.end());
  EXPECT_EQ(file_bytes(path("new.safetensors")), expected);
}

TEST_F(Safetensors, SaveRefusesNamesThatAreNotUtf8) {
  // JSON text is UTF-8: a name that is not could not be read back under the same name.
  const std::string msg = error_of([&] {
    save_safetensors(path("u.safetensors"), {{"bad\xff", Tensor::ones({1})}});
  });
  EXPECT_MENTIONS(msg, "u.safetensors");
  EXPECT_MENTIONS(msg, "UTF-8");
  EXPECT_FALSE(fs::exists(path("u.safetensors")));
}

// ---- fuzz-style headers: each fails with an error that names the file, never a crash.

// The error of loading a file with this header and body.
std::string load_error(const std::string& path, const std::string& header, size_t body,
                       uint64_t header_len = UINT64_MAX) {
  write_raw(path, header, std::vector<uint8_t>(body), header_len);
  return error_of([&] { load_safetensors(path); });
}

TEST_F(Safetensors, TruncatedHeader) {
  const std::string header = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  // The file ends inside the header that its length announces.
  std::string msg = load_error(path("t.safetensors"), header.substr(0, 20), 0, header.size());
  EXPECT_MENTIONS(msg, "t.safetensors");
  EXPECT_MENTIONS(msg, "truncated file");
  // The length is honest but the JSON text stops early.
  msg = load_error(path("t.safetensors"), header.substr(0, 20), 4);
  EXPECT_MENTIONS(msg, "t.safetensors");
  EXPECT_MENTIONS(msg, "bad header JSON");
  EXPECT_MENTIONS(msg, "tensor 'w'");
}

TEST_F(Safetensors, DeepNestingIsRejectedWithoutExhaustingTheStack) {
  for (const char* open : {"[", "{\"a\":"}) {
    std::string header = "{\"w\":";
    for (int i = 0; i < 100000; ++i) header += open;
    const std::string msg = load_error(path("d.safetensors"), header, 0);
    EXPECT_MENTIONS(msg, "d.safetensors");
    EXPECT_MENTIONS(msg, "nesting deeper than");
    EXPECT_MENTIONS(msg, "tensor 'w'");
  }
  // Well-formed and deep is no better.
  std::string header = "{\"w\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_MENTIONS(load_error(path("d.safetensors"), header, 0), "nesting deeper than");
}

TEST_F(Safetensors, HugeAndNegativeNumbers) {
  struct Case {
    const char* header;
    const char* says;
  };
  const Case cases[] = {
      // Past int64 but within uint64: past the end of the data section.
      {R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551614,18446744073709551615]}})",
       "run past the end"},
      // Past uint64: not an integer we can hold.
      {R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,18446744073709551616]}})",
       "non-negative integers"},
      {R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1e400]}})", "w"},
      {R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}})", "non-negative integers, found -1"},
      {R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0.0,1]}})", "non-negative integers"},
      {R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,"1"]}})", "non-negative integers"},
      {R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}})", "two integers"},
      {R"({"w":{"dtype":"U8","shape":[-4],"data_offsets":[0,4]}})", "non-negative integers, found -4"},
      {R"({"w":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,4]}})", "dimension too large"},
      {R"({"w":{"dtype":"U8","shape":[9],"data_offsets":[0,9]}})", "run past the end"},
  };
  for (const Case& c : cases) {
    const std::string msg = load_error(path("n.safetensors"), c.header, 4);
    EXPECT_MENTIONS(msg, "n.safetensors");
    EXPECT_MENTIONS(msg, c.says);
    EXPECT_MENTIONS(msg, "'w'");
  }
}

TEST_F(Safetensors, DuplicateKeysAreAmbiguousAndRejected) {
  const std::string w = R"({"dtype":"U8","shape":[1],"data_offsets":[0,1]})";
  std::string msg = load_error(path("k.safetensors"), "{\"w\":" + w + ",\"w\":" + w + "}", 1);
  EXPECT_MENTIONS(msg, "k.safetensors");
  EXPECT_MENTIONS(msg, "duplicate key 'w'");
  // Inside an entry and inside the metadata too.
  msg = load_error(path("k.safetensors"),
                   R"({"w":{"dtype":"U8","dtype":"F32","shape":[1],"data_offsets":[0,1]}})", 1);
  EXPECT_MENTIONS(msg, "duplicate key 'dtype'");
  EXPECT_MENTIONS(msg, "tensor 'w'");
  msg = load_error(path("k.safetensors"), R"({"__metadata__":{"a":"1","a":"2"}})", 0);
  EXPECT_MENTIONS(msg, "duplicate key 'a' (in __metadata__)");
  // -0 is 0; the same key in two different objects is fine.
  write_raw(path("k.safetensors"),
            R"({"__metadata__":{"dtype":"x"},"w":{"dtype":"U8","shape":[1],"data_offsets":[-0,1]}})", {5});
  EXPECT_EQ(load_safetensors(path("k.safetensors")).at("w").to_vector<uint8_t>(), (std::vector<uint8_t>{5}));
}

TEST_F(Safetensors, HeaderThatIsNotAnObject) {
  for (const char* header : {"[]", "\"w\"", "12345678", "null", "true"}) {
    const std::string msg = load_error(path("o.safetensors"), header, 0);
    EXPECT_MENTIONS(msg, "o.safetensors");
    EXPECT_MENTIONS(msg, "expected an object");
  }
  std::string msg = load_error(path("o.safetensors"), R"({"w":[1,2]})", 0);
  EXPECT_MENTIONS(msg, "tensor 'w': entry is an array, expected an object");
  msg = load_error(path("o.safetensors"), R"({"__metadata__":{"a":1}})", 0);
  EXPECT_MENTIONS(msg, "__metadata__ value of 'a' is a number, expected a string");
  msg = load_error(path("o.safetensors"), R"({"__metadata__":[]})", 0);
  EXPECT_MENTIONS(msg, "__metadata__ must be an object");
}

TEST_F(Safetensors, UnknownDtypeAndSizeMismatch) {
  std::string msg =
      load_error(path("u.safetensors"), R"({"w":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}})", 4);
  EXPECT_MENTIONS(msg, "u.safetensors: tensor 'w': unsupported dtype 'F8_E4M3'");
  msg = load_error(path("u.safetensors"), R"({"w":{"dtype":7,"shape":[4],"data_offsets":[0,4]}})", 4);
  EXPECT_MENTIONS(msg, "dtype must be a string");
  msg = load_error(path("u.safetensors"), R"({"w":{"dtype":"F16","shape":[4],"data_offsets":[0,4]}})", 4);
  EXPECT_MENTIONS(msg,
                  "u.safetensors: tensor 'w': data_offsets [0, 4] span 4 bytes but shape [4] of F16 needs 8");
}

TEST_F(Safetensors, OffsetsPastTheEndAndOverlapping) {
  std::string msg = load_error(
      path("p.safetensors"),
      R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
      6);
  EXPECT_MENTIONS(msg, "p.safetensors: tensor 'b': data_offsets [4, 8] run past the end");
  // Two tensors on the same bytes.
  msg = load_error(
      path("p.safetensors"),
      R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
      4);
  EXPECT_MENTIONS(msg, "overlap");
}

TEST_F(Safetensors, RandomlyCorruptedHeadersNeverCrash) {
  save_safetensors(path("good.safetensors"), golden_tensors(), {{"format", "pt"}});
  const std::string good = file_bytes(path("good.safetensors"));
  uint64_t header_len = 0;
  std::memcpy(&header_len, good.data(), 8);
  uint32_t state = 12345;
  auto next = [&] { return state = state * 1664525u + 1013904223u; };
  const std::string alphabet = "{}[]\",:0123456789-.eE \\ufx\x01\xff";
  int failures = 0;
  for (int round = 0; round < 300; ++round) {
    std::string bytes = good;
    const int edits = 1 + next() % 4;
    for (int e = 0; e < edits; ++e) {
      const size_t at = 8 + next() % header_len;
      bytes[at] = alphabet[next() % alphabet.size()];
    }
    {
      std::ofstream out(path("f.safetensors"), std::ios::binary | std::ios::trunc);
      out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    }
    try {
      load_safetensors(path("f.safetensors"));
    } catch (const std::runtime_error& e) {
      ++failures;
      ASSERT_NE(std::string(e.what()).find("f.safetensors"), std::string::npos) << e.what();
    }
  }
  EXPECT_GT(failures, 150);  // most edits break the header; the others must load cleanly
}

TEST_F(Safetensors, LoadModuleMissingTensor) {
  auto m = small_module();
  auto state = state_of(*m);
  state.erase(state.begin() + 1);  // 0.bias
  save_safetensors(path("m.safetensors"), state);
  const std::string msg = error_of([&] { load_module(path("m.safetensors"), *m); });
  EXPECT_MENTIONS(msg, "m.safetensors: tensor '0.bias': missing from the file");
}

TEST_F(Safetensors, LoadModuleExtraTensor) {
  auto m = small_module();
  auto state = state_of(*m);
  state.emplace_back("2.weight", Tensor::ones({2}));
  save_safetensors(path("e.safetensors"), state);
  const std::string msg = error_of([&] { load_module(path("e.safetensors"), *m); });
  EXPECT_MENTIONS(msg, "e.safetensors: tensor '2.weight'");
  EXPECT_MENTIONS(msg, "not in the model");
}

TEST_F(Safetensors, LoadModuleShapeMismatchLeavesTheModuleUntouched) {
  auto m = small_module();
  auto state = state_of(*m);
  for (auto& [name, t] : state) t = t.clone();
  state[0].second = Tensor::zeros({5, 4});
  state[1].second.fill_(123);
  save_safetensors(path("w.safetensors"), state);
  const std::vector<float> bias_before = state_of(*m)[1].second.to_vector<float>();
  const std::string msg = error_of([&] { load_module(path("w.safetensors"), *m); });
  EXPECT_MENTIONS(msg, "w.safetensors: tensor '0.weight': shape [5, 4] in file, [3, 4] in model");
  EXPECT_EQ(state_of(*m)[1].second.to_vector<float>(), bias_before);
}

TEST_F(Safetensors, LoadModuleDtypeMismatch) {
  auto m = small_module();
  auto state = state_of(*m);
  state[5].second = Tensor::ones({3}, DType::f64);  // 1.running_var
  save_safetensors(path("d.safetensors"), state);
  const std::string msg = error_of([&] { load_module(path("d.safetensors"), *m); });
  EXPECT_MENTIONS(msg, "d.safetensors: tensor '1.running_var': dtype F64 in file, F32 in model");
}

}  // namespace
}  // namespace trainer
