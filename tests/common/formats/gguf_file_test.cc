// Tests for GgufFile: metadata of every type, tensors of every supported type, one test per
// validation rule, truncation and corruption sweeps (no crash, always a Status), and the real
// model.
#include "common/formats/gguf_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>

#include "tests/common/formats/gguf_test_writer.h"
#include "tests/test_paths.h"

namespace riskkv {
namespace {

using ::riskkv::testing::Bytes;
using ::riskkv::testing::GgufTestWriter;
using ::riskkv::testing::Pattern;
using ::riskkv::testing::Put;
using ::riskkv::testing::PutString;
using ::riskkv::testing::WriteTempFile;
using ::testing::HasSubstr;
using Type = GgufValue::Type;
namespace fs = std::filesystem;

absl::StatusOr<std::unique_ptr<GgufFile>> OpenBytes(const Bytes& bytes,
                                                    const std::string& name = "t.gguf") {
  return GgufFile::Open(WriteTempFile(name, bytes));
}

// Opens `w`'s file and expects InvalidArgument with the path, "byte offset" and every substring.
void ExpectInvalid(const GgufTestWriter& w, const std::vector<std::string>& substrings) {
  const std::string path = WriteTempFile("bad.gguf", w.Build());
  auto f = GgufFile::Open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
  const std::string msg(f.status().message());
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("byte offset"));
  for (const std::string& s : substrings) EXPECT_THAT(msg, HasSubstr(s));
}

// A small file with every metadata type and a tensor of every supported type.
GgufTestWriter RichWriter() {
  GgufTestWriter w;
  w.AddString("general.architecture", "llama");
  w.AddScalar<uint8_t>("u8", Type::kUint8, 200);
  w.AddScalar<int8_t>("i8", Type::kInt8, -5);
  w.AddScalar<uint16_t>("u16", Type::kUint16, 60000);
  w.AddScalar<int16_t>("i16", Type::kInt16, -30000);
  w.AddScalar<uint32_t>("u32", Type::kUint32, 4000000000u);
  w.AddScalar<int32_t>("i32", Type::kInt32, -2000000000);
  w.AddScalar<float>("f32", Type::kFloat32, 1.5f);
  w.AddScalar<uint8_t>("yes", Type::kBool, 1);
  w.AddScalar<uint8_t>("no", Type::kBool, 0);
  w.AddScalar<uint64_t>("u64", Type::kUint64, std::numeric_limits<uint64_t>::max());
  w.AddScalar<int64_t>("i64", Type::kInt64, std::numeric_limits<int64_t>::min());
  w.AddScalar<double>("f64", Type::kFloat64, 3.25);
  w.AddStringArray("strs", {"a", "", "\xc3\xbcnicode"});
  w.AddArray<int32_t>("i32s", Type::kInt32, {1, -2, 3});
  w.AddArray<uint8_t>("u8s", Type::kUint8, {0, 255});
  w.AddArray<uint64_t>("u64s", Type::kUint64, {7, 1ull << 62});
  w.AddArray<uint8_t>("bools", Type::kBool, {1, 0, 1});
  w.AddArray<float>("f32s", Type::kFloat32, {0.5f, -1.25f});
  w.AddArray<double>("f64s", Type::kFloat64, {1e-300, 2.0});
  w.AddArray<int32_t>("empty", Type::kInt32, {});
  w.AddTensor("f32", testing::kGgmlF32, {4, 3}, Pattern(48, 1));
  w.AddTensor("f16", testing::kGgmlF16, {8}, Pattern(16, 2));
  w.AddTensor("bf16", testing::kGgmlBF16, {2, 2, 2}, Pattern(16, 3));
  w.AddTensor("q8_0", testing::kGgmlQ8_0, {64, 2}, Pattern(2 * 2 * 34, 4));
  w.AddTensor("q4_0", testing::kGgmlQ4_0, {32, 3}, Pattern(3 * 18, 5));
  w.AddTensor("q4_1", testing::kGgmlQ4_1, {32, 1, 1, 2}, Pattern(2 * 20, 6));
  w.AddTensor("q5_0", testing::kGgmlQ5_0, {64}, Pattern(2 * 22, 7));
  w.AddTensor("q5_1", testing::kGgmlQ5_1, {32, 2}, Pattern(2 * 24, 8));
  w.AddTensor("q4_k", testing::kGgmlQ4_K, {256, 2}, Pattern(2 * 144, 9));
  w.AddTensor("q5_k", testing::kGgmlQ5_K, {512}, Pattern(2 * 176, 10));
  w.AddTensor("q6_k", testing::kGgmlQ6_K, {256, 1, 3}, Pattern(3 * 210, 11));
  return w;
}

TEST(GgufFileTest, ReadsEveryScalarType) {
  auto f = OpenBytes(RichWriter().Build());
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& g = **f;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(*g.GetString("general.architecture"), "llama");
  EXPECT_EQ(*g.GetUint("u8"), 200u);
  EXPECT_EQ(*g.GetInt("i8"), -5);
  EXPECT_EQ(*g.GetUint("u16"), 60000u);
  EXPECT_EQ(*g.GetInt("i16"), -30000);
  EXPECT_EQ(*g.GetUint("u32"), 4000000000u);
  EXPECT_EQ(*g.GetInt("u32"), 4000000000);  // unsigned that fits in int64
  EXPECT_EQ(*g.GetInt("i32"), -2000000000);
  EXPECT_DOUBLE_EQ(*g.GetFloat("f32"), 1.5);
  EXPECT_TRUE(*g.GetBool("yes"));
  EXPECT_FALSE(*g.GetBool("no"));
  EXPECT_EQ(*g.GetUint("u64"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(*g.GetInt("i64"), std::numeric_limits<int64_t>::min());
  EXPECT_DOUBLE_EQ(*g.GetFloat("f64"), 3.25);
  EXPECT_EQ(g.Find("i16")->type, Type::kInt16);
  EXPECT_EQ(std::get<int64_t>(g.Find("i16")->scalar), -30000);
  EXPECT_EQ(std::get<uint64_t>(g.Find("yes")->scalar), 1u);
  // Metadata keeps file order.
  ASSERT_EQ(g.metadata().size(), 21u);
  EXPECT_EQ(g.metadata()[0].first, "general.architecture");
  EXPECT_EQ(g.metadata()[20].first, "empty");
}

TEST(GgufFileTest, GettersReportMissingKeysWrongTypesAndRange) {
  auto f = OpenBytes(RichWriter().Build());
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& g = **f;
  EXPECT_FALSE(g.Has("nope"));
  EXPECT_EQ(g.GetUint("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(g.GetUint("nope").status().message()), HasSubstr("nope"));
  EXPECT_EQ(g.GetInt("u64").status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(g.GetUint("i8").status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(g.GetFloat("u8").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetBool("u8").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetUint("yes").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetString("i32s").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(g.GetString("i32s").status().message()), HasSubstr("array of int32"));
  EXPECT_EQ(g.GetStringArray("i32s").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetIntArray("f32s").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetFloatArray("strs").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetUint("strs").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GgufFileTest, ReadsArrays) {
  auto f = OpenBytes(RichWriter().Build());
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& g = **f;
  EXPECT_EQ(*g.GetStringArray("strs"), (std::vector<std::string>{"a", "", "\xc3\xbcnicode"}));
  EXPECT_EQ(*g.GetIntArray("i32s"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(*g.GetIntArray("u8s"), (std::vector<int64_t>{0, 255}));
  EXPECT_EQ(*g.GetIntArray("u64s"), (std::vector<int64_t>{7, int64_t{1} << 62}));
  EXPECT_EQ(*g.GetIntArray("bools"), (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(*g.GetFloatArray("f32s"), (std::vector<double>{0.5, -1.25}));
  EXPECT_EQ(*g.GetFloatArray("f64s"), (std::vector<double>{1e-300, 2.0}));
  EXPECT_TRUE(g.GetIntArray("empty")->empty());
  EXPECT_EQ(g.Find("strs")->type, Type::kArray);
  EXPECT_EQ(g.Find("strs")->array_type, Type::kString);
  EXPECT_EQ(g.Find("bools")->array_type, Type::kBool);
}

TEST(GgufFileTest, ReadsTensorsOfEverySupportedType) {
  GgufTestWriter w = RichWriter();
  auto f = OpenBytes(w.Build());
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& g = **f;
  struct Want {
    const char* name;
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t nbytes;
    uint8_t seed;
  };
  const std::vector<Want> want = {
      {"f32", DType::kF32, {3, 4}, 48, 1},          {"f16", DType::kF16, {8}, 16, 2},
      {"bf16", DType::kBF16, {2, 2, 2}, 16, 3},     {"q8_0", DType::kQ8_0, {2, 64}, 136, 4},
      {"q4_0", DType::kQ4_0, {3, 32}, 54, 5},       {"q4_1", DType::kQ4_1, {2, 1, 1, 32}, 40, 6},
      {"q5_0", DType::kQ5_0, {64}, 44, 7},          {"q5_1", DType::kQ5_1, {2, 32}, 48, 8},
      {"q4_k", DType::kQ4_K, {2, 256}, 288, 9},     {"q5_k", DType::kQ5_K, {512}, 352, 10},
      {"q6_k", DType::kQ6_K, {3, 1, 256}, 630, 11},
  };
  ASSERT_EQ(g.tensors().size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(want[i].name);
    const TensorView& t = g.tensors()[i];
    EXPECT_EQ(&t, g.FindTensor(want[i].name));
    EXPECT_EQ(t.name, want[i].name);
    EXPECT_EQ(t.dtype, want[i].dtype);
    EXPECT_EQ(t.shape, want[i].shape);
    EXPECT_EQ(t.nbytes, want[i].nbytes);
    const Bytes expected = Pattern(want[i].nbytes, want[i].seed);
    ASSERT_NE(t.data, nullptr);
    EXPECT_EQ(std::memcmp(t.data, expected.data(), expected.size()), 0);
    // The mapping is page-aligned, so data alignment in the file is alignment in memory.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 32, 0u);
  }
  EXPECT_EQ(g.FindTensor("missing"), nullptr);
}

TEST(GgufFileTest, AcceptsVersion2AndNoTensors) {
  GgufTestWriter w;
  w.version = 2;
  w.AddScalar<uint32_t>("llama.block_count", Type::kUint32, 30);
  auto f = OpenBytes(w.Build());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->version(), 2u);
  EXPECT_TRUE((*f)->tensors().empty());
  EXPECT_EQ(*(*f)->GetUint("llama.block_count"), 30u);
}

TEST(GgufFileTest, HonorsCustomAlignment) {
  GgufTestWriter w;
  w.SetAlignment(256);
  w.AddTensor("a", testing::kGgmlF32, {3}, Pattern(12, 1));
  w.AddTensor("b", testing::kGgmlF32, {5}, Pattern(20, 2));
  auto f = OpenBytes(w.Build());
  ASSERT_TRUE(f.ok()) << f.status();
  for (const TensorView& t : (*f)->tensors()) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 256, 0u);
  }
  EXPECT_EQ((*f)->FindTensor("b")->data - (*f)->FindTensor("a")->data, 256);
  EXPECT_EQ(std::memcmp((*f)->FindTensor("b")->data, Pattern(20, 2).data(), 20), 0);
}

TEST(GgufFileTest, RejectsBadMagicAndVersions) {
  GgufTestWriter w;
  w.magic = 0x58554747;  // "GGUX"
  ExpectInvalid(w, {"magic", "byte offset 0"});
  w = GgufTestWriter();
  w.version = 1;
  ExpectInvalid(w, {"version 1 is not supported", "byte offset 4"});
  w.version = 7;
  ExpectInvalid(w, {"unsupported GGUF version 7"});
  w.version = 0x03000000;
  ExpectInvalid(w, {"big-endian"});
}

TEST(GgufFileTest, RejectsUnsupportedTensorTypeNamingTensorAndId) {
  GgufTestWriter w;
  w.AddTensor("blk.0.ffn_down.weight", testing::kGgmlQ2_K, {256}, Pattern(84, 1));
  ExpectInvalid(w, {"blk.0.ffn_down.weight", "ggml type 10", "Q2_K", "supported:", "Q6_K"});
  GgufTestWriter w1;
  w1.AddTensor("narrow", testing::kGgmlQ4_K, {128}, Pattern(72, 1));
  ExpectInvalid(w1, {"narrow", "innermost dimension 128", "Q4_K block size 256"});
  GgufTestWriter w2;
  w2.AddTensor("weird", 99, {32}, Pattern(32, 1));
  ExpectInvalid(w2, {"weird", "ggml type 99"});
}

TEST(GgufFileTest, RejectsTensorDataPastEndOfFile) {
  GgufTestWriter w;
  w.AddTensor("a", testing::kGgmlF32, {4}, Pattern(16, 1));
  w.AddTensor("far", testing::kGgmlF32, {4}, {}, /*offset=*/1024);
  ExpectInvalid(w, {"'far'", "past the end of the file"});
  GgufTestWriter w2;  // An offset so large that data start + offset wraps around.
  w2.AddTensor("wrap", testing::kGgmlF32, {4}, {},
               /*offset=*/std::numeric_limits<uint64_t>::max() - 31);
  ExpectInvalid(w2, {"'wrap'", "past the end"});
}

TEST(GgufFileTest, RejectsBadAlignment) {
  for (uint32_t a : {0u, 3u, 48u}) {
    GgufTestWriter w;
    w.AddScalar<uint32_t>("general.alignment", Type::kUint32, a);
    ExpectInvalid(w, {"general.alignment", "power of two"});
  }
  GgufTestWriter w;
  w.AddScalar<int32_t>("general.alignment", Type::kInt32, -32);
  ExpectInvalid(w, {"power of two"});
  GgufTestWriter w2;
  w2.AddString("general.alignment", "32");
  ExpectInvalid(w2, {"must be an integer"});
  GgufTestWriter w3;  // Tensor offset not a multiple of the alignment.
  w3.AddTensor("a", testing::kGgmlF32, {4}, Pattern(16, 1));
  w3.AddTensor("b", testing::kGgmlF32, {4}, {}, /*offset=*/8);
  ExpectInvalid(w3, {"'b'", "not a multiple of the alignment 32"});
}

TEST(GgufFileTest, RejectsBadDimensions) {
  GgufTestWriter w;
  w.AddTensor("five", testing::kGgmlF32, {1, 1, 1, 1, 1}, Pattern(4, 1));
  ExpectInvalid(w, {"'five'", "n_dims 5"});
  GgufTestWriter w0;
  w0.AddTensor("scalar", testing::kGgmlF32, {}, Pattern(4, 1));
  ExpectInvalid(w0, {"n_dims 0"});
  GgufTestWriter wz;
  wz.AddTensor("zero", testing::kGgmlF32, {4, 0}, {});
  ExpectInvalid(wz, {"'zero'", "ne[1] = 0"});
  GgufTestWriter wo;
  wo.AddTensor("numel", testing::kGgmlF32, {1ull << 32, 1ull << 32}, {});
  ExpectInvalid(wo, {"'numel'", "element count overflows"});
  GgufTestWriter wb;  // 2^62 elements fit in int64; their 2^64 bytes do not.
  wb.AddTensor("bytes", testing::kGgmlF32, {1ull << 31, 1ull << 31}, {});
  ExpectInvalid(wb, {"'bytes'", "byte size overflows"});
  GgufTestWriter wq;
  wq.AddTensor("q", testing::kGgmlQ8_0, {33}, Pattern(34, 1));
  ExpectInvalid(wq, {"'q'", "not a multiple of the Q8_0 block size 32"});
}

TEST(GgufFileTest, RejectsHugeLengthsAndCounts) {
  GgufTestWriter w;
  Bytes b;
  Put<uint64_t>(b, uint64_t{1} << 60);
  w.AddRaw("s", static_cast<uint32_t>(Type::kString), b);
  ExpectInvalid(w, {"'s'", "string length 1152921504606846976"});

  GgufTestWriter wk;  // Huge key length: the raw encoder writes the length, no key bytes.
  wk.AddRaw("", static_cast<uint32_t>(Type::kUint8), {});
  wk.kv_count = 1;
  Bytes file = wk.Build();
  file.resize(file.size() + 64);  // room for the entry, so the key length is what fails
  const uint64_t huge = ~uint64_t{0};
  std::memcpy(file.data() + 24, &huge, 8);
  auto f = OpenBytes(file);
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("string length 18446744073709551615"));

  for (Type elem : {Type::kInt32, Type::kString, Type::kFloat64}) {
    for (uint64_t count : {uint64_t{1000}, uint64_t{1} << 61}) {
      GgufTestWriter wa;
      Bytes arr;
      Put<uint32_t>(arr, static_cast<uint32_t>(elem));
      Put<uint64_t>(arr, count);
      Put<uint64_t>(arr, 0);  // a few bytes of elements, far fewer than the count needs
      wa.AddRaw("arr", static_cast<uint32_t>(Type::kArray), arr);
      ExpectInvalid(wa, {"'arr'", "array of " + std::to_string(count),
                         count == 1000 ? "needs at least" : "exceeds the limit"});
    }
  }
  GgufTestWriter wt;
  wt.tensor_count = uint64_t{1} << 40;
  ExpectInvalid(wt, {"tensor count"});
  GgufTestWriter wc;
  wc.kv_count = ~uint64_t{0};
  ExpectInvalid(wc, {"metadata count"});
}

TEST(GgufFileTest, RejectsMalformedValues) {
  GgufTestWriter wn;
  Bytes nested;
  Put<uint32_t>(nested, static_cast<uint32_t>(Type::kArray));
  Put<uint64_t>(nested, 1);
  wn.AddRaw("nested", static_cast<uint32_t>(Type::kArray), nested);
  ExpectInvalid(wn, {"'nested'", "nested arrays"});
  GgufTestWriter wt;
  wt.AddRaw("odd", 13, {0, 0, 0, 0});
  ExpectInvalid(wt, {"'odd'", "unknown metadata value type 13"});
  GgufTestWriter wb;
  wb.AddScalar<uint8_t>("flag", Type::kBool, 2);
  ExpectInvalid(wb, {"'flag'", "neither 0 nor 1"});
  GgufTestWriter wu;
  wu.AddArray<uint64_t>("big", Type::kUint64, {1, uint64_t{1} << 63});
  ExpectInvalid(wu, {"'big'", "does not fit in int64"});
}

TEST(GgufFileTest, RejectsDuplicates) {
  GgufTestWriter w;
  w.AddScalar<uint32_t>("k", Type::kUint32, 1);
  w.AddString("k", "again");
  ExpectInvalid(w, {"'k'", "duplicate metadata key"});
  GgufTestWriter wt;
  wt.AddTensor("w", testing::kGgmlF32, {4}, Pattern(16, 1));
  wt.AddTensor("w", testing::kGgmlF32, {4}, Pattern(16, 2));
  ExpectInvalid(wt, {"'w'", "duplicate tensor name"});
}

TEST(GgufFileTest, RejectsFilesThatAreNotGguf) {
  auto missing = GgufFile::Open((testing::ProcessTempDir() / "does_not_exist.gguf").string());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  auto dir = GgufFile::Open(testing::ProcessTempDir().string());
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kInvalidArgument);
  auto empty = OpenBytes({});
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(empty.status().message()), HasSubstr("magic"));
}

// Cuts the file at `sizes` (largest first, so one copy serves all) and expects every prefix to
// fail cleanly.
void ExpectEveryPrefixFails(const fs::path& path, std::vector<uint64_t> sizes) {
  std::sort(sizes.rbegin(), sizes.rend());
  for (uint64_t n : sizes) {
    fs::resize_file(path, n);
    auto f = GgufFile::Open(path.string());
    EXPECT_FALSE(f.ok()) << "prefix of " << n << " bytes opened";
    if (!f.ok()) {
      EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
    }
  }
}

TEST(GgufFileTest, EveryTruncationOfSmallFileFails) {
  const Bytes file = RichWriter().Build();
  const std::string path = WriteTempFile("trunc.gguf", file);
  ASSERT_TRUE(GgufFile::Open(path).ok());
  std::vector<uint64_t> sizes(file.size());
  for (uint64_t i = 0; i < file.size(); ++i) sizes[i] = i;
  ExpectEveryPrefixFails(path, sizes);
}

TEST(GgufFileTest, RandomCorruptionNeverCrashes) {
  const Bytes file = RichWriter().Build();
  size_t header_size = 0;  // bytes before the first tensor's data
  {
    auto f = OpenBytes(file);
    ASSERT_TRUE(f.ok()) << f.status();
    const TensorView& first = (*f)->tensors().front();
    const TensorView& last = (*f)->tensors().back();
    header_size = file.size() - (last.data + last.nbytes - first.data);  // last ends the file
  }
  std::mt19937 rng(1234);
  volatile uint8_t sink = 0;  // reads of tensor data must not be optimised away
  int opened = 0;
  for (int iter = 0; iter < 600; ++iter) {
    Bytes b = file;
    const int flips = 1 + iter % 4;
    for (int k = 0; k < flips; ++k) {
      // Every other file is hit only in the header and directory, where lengths and counts live.
      const size_t at = rng() % (iter % 4 < 2 ? header_size : b.size());
      b[at] = static_cast<uint8_t>(iter % 2 ? rng() : b[at] ^ (1u << (rng() % 8)));
    }
    auto f = OpenBytes(b, "corrupt.gguf");
    if (!f.ok()) continue;
    ++opened;
    // Anything that opens must describe tensors lying inside the mapping.
    for (const TensorView& t : (*f)->tensors()) {
      for (uint64_t i = 0; i < t.nbytes; ++i) sink = t.data[i];
    }
  }
  (void)sink;
  EXPECT_GT(opened, 0);  // Some flips hit data bytes only, so the sweep did reach OK paths too.
}

class RealModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = riskkv::testing::DefaultModelPath();
    if (!fs::exists(path_)) GTEST_SKIP() << "default model not found at " << path_;
  }
  fs::path path_;
};

TEST_F(RealModelTest, OpensSmolLm2) {
  auto f = GgufFile::Open(path_.string());
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& g = **f;
  EXPECT_EQ(g.tensors().size(), 272u);
  EXPECT_EQ(*g.GetString("general.architecture"), "llama");
  EXPECT_EQ(*g.GetUint("llama.block_count"), 30u);
  EXPECT_EQ(*g.GetUint("llama.embedding_length"), 576u);
  EXPECT_EQ(g.GetStringArray("tokenizer.ggml.tokens")->size(), 49152u);
  const TensorView* emb = g.FindTensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->dtype, DType::kQ8_0);
  EXPECT_EQ(emb->shape, (std::vector<int64_t>{49152, 576}));
  EXPECT_EQ(emb->nbytes, 49152u * 576 / 32 * 34);
  const TensorView* q = g.FindTensor("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->dtype, DType::kQ4_1);
  EXPECT_EQ(q->shape, (std::vector<int64_t>{576, 576}));
  EXPECT_EQ(q->nbytes, 576u * 576 / 32 * 20);
  // Tensor data ranges are disjoint.
  std::vector<const TensorView*> by_addr;
  for (const TensorView& t : g.tensors()) by_addr.push_back(&t);
  std::sort(by_addr.begin(), by_addr.end(), [](auto* a, auto* b) { return a->data < b->data; });
  for (size_t i = 1; i < by_addr.size(); ++i) {
    EXPECT_LE(by_addr[i - 1]->data + by_addr[i - 1]->nbytes, by_addr[i]->data) << by_addr[i]->name;
  }
}

TEST_F(RealModelTest, TruncationsFail) {
  uint64_t tensor_bytes = 0;
  uint64_t n_tensors = 0;
  uint64_t size = 0;
  {
    auto f = GgufFile::Open(path_.string());
    ASSERT_TRUE(f.ok()) << f.status();
    for (const TensorView& t : (*f)->tensors()) tensor_bytes += t.nbytes;
    n_tensors = (*f)->tensors().size();
    size = (*f)->file_size();
  }
  // Everything below this lies in the header, metadata or tensor directory (at most
  // alignment - 1 padding bytes per tensor sit in the data section).
  const uint64_t header_end = size - tensor_bytes - n_tensors * 32;
  ASSERT_GT(header_end, 1000000u);  // the tokenizer alone takes well over 1 MB
  std::vector<uint64_t> sizes = {0, 1, 3, 4, 7, 8, 15, 16, 23, 24, 31, 40, 100};
  for (int i = 1; i <= 30; ++i) sizes.push_back(header_end * i / 31);
  sizes.push_back(header_end - 1);
  // Tensor data region: the last tensor ends exactly at the end of this file.
  for (uint64_t n : {size - tensor_bytes + 64, size / 2, size - 4096, size - 1}) sizes.push_back(n);

  const fs::path copy = testing::ProcessTempDir() / "model_trunc.gguf";
  fs::copy_file(path_, copy, fs::copy_options::overwrite_existing);
  ExpectEveryPrefixFails(copy, sizes);
  fs::remove(copy);
}

}  // namespace
}  // namespace riskkv
