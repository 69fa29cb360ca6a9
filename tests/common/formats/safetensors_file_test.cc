// Tests for SafetensorsFile: a valid file with every supported dtype and metadata, one test per
// validation rule, and truncation / corruption sweeps that must fail cleanly.
#include "common/formats/safetensors_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>

#include "tests/common/formats/gguf_test_writer.h"

namespace riskkv {
namespace {

using ::riskkv::testing::Bytes;
using ::riskkv::testing::Pattern;
using ::riskkv::testing::WriteTempFile;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

// 8-byte header length, the JSON text, then `data`. `length` overrides the header length field.
Bytes BuildFile(const std::string& json, const Bytes& data,
                std::optional<uint64_t> length = std::nullopt) {
  Bytes out(8 + json.size() + data.size());
  const uint64_t n = length.value_or(json.size());
  std::memcpy(out.data(), &n, sizeof(n));
  std::copy(json.begin(), json.end(), out.begin() + 8);
  std::copy(data.begin(), data.end(), out.begin() + 8 + json.size());
  return out;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> OpenBytes(const Bytes& b,
                                                           const std::string& name = "t.st") {
  return SafetensorsFile::Open(WriteTempFile(name, b));
}

void ExpectInvalid(const Bytes& b, const std::vector<std::string>& substrings) {
  const std::string path = WriteTempFile("bad.safetensors", b);
  auto f = SafetensorsFile::Open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
  const std::string msg(f.status().message());
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("byte offset"));
  for (const std::string& s : substrings) EXPECT_THAT(msg, HasSubstr(s));
}

// Header for a single tensor entry.
std::string One(const std::string& name, const std::string& dtype, const std::string& shape,
                const std::string& offsets) {
  return "{\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
         ",\"data_offsets\":" + offsets + "}}";
}

const char kValidHeader[] = R"({"__metadata__":{"format":"pt","note":"tiny"},)"
                            R"("w.f32":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                            R"("b.f16":{"dtype":"F16","shape":[4],"data_offsets":[24,32]},)"
                            R"("empty":{"dtype":"F32","shape":[0,5],"data_offsets":[32,32]},)"
                            R"("a.bf16":{"dtype":"BF16","shape":[2,2],"data_offsets":[32,40]}})";

Bytes ValidFile() { return BuildFile(kValidHeader, Pattern(40, 9)); }

TEST(SafetensorsFileTest, ReadsTensorsAndMetadata) {
  auto f = OpenBytes(ValidFile());
  ASSERT_TRUE(f.ok()) << f.status();
  const SafetensorsFile& s = **f;
  const Bytes data = Pattern(40, 9);
  struct Want {
    const char* name;
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t begin, nbytes;
  };
  const std::vector<Want> want = {{"w.f32", DType::kF32, {2, 3}, 0, 24},
                                  {"b.f16", DType::kF16, {4}, 24, 8},
                                  {"empty", DType::kF32, {0, 5}, 32, 0},
                                  {"a.bf16", DType::kBF16, {2, 2}, 32, 8}};
  ASSERT_EQ(s.tensors().size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {  // in data-offset order
    SCOPED_TRACE(want[i].name);
    const TensorView& t = s.tensors()[i];
    EXPECT_EQ(s.FindTensor(want[i].name), &t);
    EXPECT_EQ(t.name, want[i].name);
    EXPECT_EQ(t.dtype, want[i].dtype);
    EXPECT_EQ(t.shape, want[i].shape);
    EXPECT_EQ(t.nbytes, want[i].nbytes);
    EXPECT_EQ(std::memcmp(t.data, data.data() + want[i].begin, t.nbytes), 0);
  }
  // Data pointers are laid out as the offsets say, relative to one another.
  EXPECT_EQ(s.FindTensor("a.bf16")->data - s.FindTensor("w.f32")->data, 32);
  EXPECT_EQ(s.FindTensor("nope"), nullptr);
  EXPECT_EQ(s.metadata(),
            (std::vector<std::pair<std::string, std::string>>{{"format", "pt"}, {"note", "tiny"}}));
}

TEST(SafetensorsFileTest, AcceptsPaddedHeaderAndNoTensors) {
  // Writers pad the header with spaces to an 8-byte boundary.
  auto f = OpenBytes(BuildFile(One("x", "F16", "[2]", "[0,4]") + "      ", Pattern(4, 1)));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->tensors().size(), 1u);
  auto e = OpenBytes(BuildFile("{}", {}));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_TRUE((*e)->tensors().empty());
  EXPECT_TRUE((*e)->metadata().empty());
}

TEST(SafetensorsFileTest, RejectsBadHeaderLength) {
  ExpectInvalid(Bytes{1, 2, 3}, {"header length", "only 3"});
  ExpectInvalid(BuildFile("{}", {}, 0), {"header length 0"});
  ExpectInvalid(BuildFile("{}", {}, 3), {"header length 3"});  // one past the file
  ExpectInvalid(BuildFile("{}", {}, uint64_t{1} << 62), {"header length 4611686018427387904"});
  ExpectInvalid(BuildFile("{}", {}, ~uint64_t{0}), {"header length"});
  auto empty = OpenBytes({});
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SafetensorsFileTest, RejectsInvalidJson) {
  ExpectInvalid(BuildFile("{\"a\": [1, 2", {}), {"invalid JSON"});
  ExpectInvalid(BuildFile("{\"a\":\xff}", {}), {"invalid JSON"});
  ExpectInvalid(BuildFile("[1, 2]", {}), {"not an object"});
  ExpectInvalid(BuildFile("{} {}", {}), {"invalid JSON"});
}

TEST(SafetensorsFileTest, RejectsMalformedEntries) {
  ExpectInvalid(BuildFile(R"({"t":5})", {}), {"'t'", "not an object"});
  ExpectInvalid(BuildFile(R"({"t":{"shape":[1],"data_offsets":[0,4]}})", Pattern(4, 1)),
                {"'t'", "dtype"});
  ExpectInvalid(BuildFile(R"({"t":{"dtype":"F32","data_offsets":[0,4]}})", Pattern(4, 1)),
                {"'t'", "shape"});
  ExpectInvalid(BuildFile(One("t", "F32", "[1]", "[0]"), Pattern(4, 1)), {"'t'", "data_offsets"});
  ExpectInvalid(BuildFile(One("t", "F32", "[-1]", "[0,4]"), Pattern(4, 1)),
                {"'t'", "non-negative"});
  ExpectInvalid(BuildFile(One("t", "F32", "[1.5]", "[0,4]"), Pattern(4, 1)),
                {"'t'", "non-negative"});
  ExpectInvalid(BuildFile(One("t", "F32", "[1]", "[-4,0]"), Pattern(4, 1)),
                {"'t'", "non-negative"});
  ExpectInvalid(BuildFile(One("t", "F32", "[4294967296,4294967296]", "[0,4]"), Pattern(4, 1)),
                {"'t'", "overflows"});
  ExpectInvalid(BuildFile(R"({"__metadata__":{"k":1}})", {}), {"__metadata__", "'k'"});
  ExpectInvalid(BuildFile(R"({"__metadata__":[]})", {}), {"__metadata__"});
}

TEST(SafetensorsFileTest, RejectsUnsupportedDtypeNamingTensor) {
  ExpectInvalid(BuildFile(One("pos_ids", "I64", "[2]", "[0,16]"), Pattern(16, 1)),
                {"'pos_ids'", "unsupported dtype 'I64'"});
  ExpectInvalid(BuildFile(One("w8", "F8_E4M3", "[4]", "[0,4]"), Pattern(4, 1)),
                {"'w8'", "unsupported dtype 'F8_E4M3'"});
}

TEST(SafetensorsFileTest, RejectsOffsetMismatchAndOutOfBounds) {
  ExpectInvalid(BuildFile(One("t", "F32", "[3]", "[0,8]"), Pattern(8, 1)),
                {"'t'", "span 8 bytes", "needs 12"});
  ExpectInvalid(BuildFile(One("t", "F16", "[2]", "[8,4]"), Pattern(8, 1)), {"'t'", "end before"});
  ExpectInvalid(BuildFile(One("t", "F32", "[2]", "[4,12]"), Pattern(8, 1)),
                {"'t'", "run past the 8-byte"});
  ExpectInvalid(
      BuildFile(One("t", "F32", "[1]", "[18446744073709551612,18446744073709551616]"), {}),
      {"'t'"});
}

TEST(SafetensorsFileTest, RejectsOverlapAndDuplicates) {
  ExpectInvalid(BuildFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F16","shape":[2],"data_offsets":[6,10]}})",
                          Pattern(10, 1)),
                {"'b'", "overlaps tensor 'a'"});
  ExpectInvalid(BuildFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                          R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                          Pattern(8, 1)),
                {"'a'", "duplicate"});
}

TEST(SafetensorsFileTest, EveryTruncationFails) {
  const Bytes file = ValidFile();
  const std::string path = WriteTempFile("trunc.safetensors", file);
  ASSERT_TRUE(SafetensorsFile::Open(path).ok());
  for (uint64_t n = file.size(); n-- > 0;) {  // the last tensor ends the file
    fs::resize_file(path, n);
    auto f = SafetensorsFile::Open(path);
    EXPECT_FALSE(f.ok()) << "prefix of " << n << " bytes opened";
    if (!f.ok()) {
      EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
    }
  }
}

TEST(SafetensorsFileTest, RandomCorruptionNeverCrashes) {
  const Bytes file = ValidFile();
  std::mt19937 rng(99);
  volatile uint8_t sink = 0;  // reads of tensor data must not be optimised away
  for (int iter = 0; iter < 600; ++iter) {
    Bytes b = file;
    for (int k = 0; k <= iter % 3; ++k) {
      const size_t at = rng() % b.size();
      b[at] = static_cast<uint8_t>(iter % 2 ? rng() : b[at] ^ (1u << (rng() % 8)));
    }
    auto f = OpenBytes(b, "corrupt.safetensors");
    if (!f.ok()) continue;
    // Anything that opens must describe tensors lying inside the mapping.
    for (const TensorView& t : (*f)->tensors()) {
      for (uint64_t i = 0; i < t.nbytes; ++i) sink = t.data[i];
    }
  }
  (void)sink;
}

}  // namespace
}  // namespace riskkv
