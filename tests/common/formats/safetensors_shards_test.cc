// Tests for SafetensorsShards: a model directory with one file, one with an index over two
// shards of different dtypes, and one test per rule the index must follow.
#include "common/formats/safetensors_shards.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/common/formats/gguf_test_writer.h"

namespace riskkv {
namespace {

using ::riskkv::testing::Bytes;
using ::riskkv::testing::Pattern;
using ::riskkv::testing::ProcessTempDir;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

// A safetensors file holding one tensor per (name, dtype, shape, bytes) entry, back to back.
struct Entry {
  std::string name, dtype, shape;
  size_t bytes;
};
void WriteShard(const fs::path& path, const std::vector<Entry>& entries) {
  std::string json = "{";
  size_t offset = 0;
  for (const Entry& e : entries) {
    if (json.size() > 1) json += ",";
    json += "\"" + e.name + "\":{\"dtype\":\"" + e.dtype + "\",\"shape\":" + e.shape +
            ",\"data_offsets\":[" + std::to_string(offset) + "," +
            std::to_string(offset + e.bytes) + "]}";
    offset += e.bytes;
  }
  json += "}";
  const uint64_t n = json.size();
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(&n), sizeof(n));
  f << json;
  const Bytes data = Pattern(offset, 3);
  f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

// DIR with shard a (x: F32 [2], z: F32 [1], unlisted) and shard b (y: F16 [4]), and an index
// whose text is `index` (nothing when empty).
fs::path MakeDir(const std::string& name, const std::string& index) {
  const fs::path dir = ProcessTempDir() / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  WriteShard(dir / "a.safetensors", {{"x", "F32", "[2]", 8}, {"z", "F32", "[1]", 4}});
  WriteShard(dir / "b.safetensors", {{"y", "F16", "[4]", 8}});
  if (!index.empty()) std::ofstream(dir / "model.safetensors.index.json") << index;
  return dir;
}

constexpr char kGoodIndex[] =
    R"({"metadata": {"total_size": 16}, "weight_map": {"x": "a.safetensors", "y": "b.safetensors"}})";

TEST(SafetensorsShardsTest, ReadsTheTensorsTheIndexMaps) {
  auto shards = SafetensorsShards::Open(MakeDir("good", kGoodIndex).string());
  ASSERT_TRUE(shards.ok()) << shards.status();
  EXPECT_EQ((*shards)->shards().size(), 2u);
  const TensorView* x = (*shards)->FindTensor("x");
  const TensorView* y = (*shards)->FindTensor("y");
  ASSERT_NE(x, nullptr);
  ASSERT_NE(y, nullptr);
  EXPECT_EQ(x->dtype, DType::kF32);
  EXPECT_EQ(x->shape, std::vector<int64_t>{2});
  EXPECT_EQ(y->dtype, DType::kF16);
  EXPECT_EQ(y->shape, std::vector<int64_t>{4});
  EXPECT_EQ(std::memcmp(y->data, Pattern(8, 3).data(), 8), 0);
  // A tensor a shard holds but the map does not list is not part of the model.
  EXPECT_EQ((*shards)->FindTensor("z"), nullptr);
}

TEST(SafetensorsShardsTest, WithoutAnIndexReadsModelSafetensors) {
  const fs::path dir = MakeDir("single", "");
  fs::rename(dir / "a.safetensors", dir / "model.safetensors");
  auto shards = SafetensorsShards::Open(dir.string());
  ASSERT_TRUE(shards.ok()) << shards.status();
  EXPECT_NE((*shards)->FindTensor("x"), nullptr);
  EXPECT_NE((*shards)->FindTensor("z"), nullptr);
  EXPECT_EQ((*shards)->FindTensor("y"), nullptr);
  fs::remove(dir / "model.safetensors");
  EXPECT_FALSE(SafetensorsShards::Open(dir.string()).ok());
}

void ExpectRefused(const std::string& name, const std::string& index, const std::string& fragment) {
  auto shards = SafetensorsShards::Open(MakeDir(name, index).string());
  ASSERT_FALSE(shards.ok()) << name << " was accepted";
  EXPECT_THAT(shards.status().message(), HasSubstr(fragment)) << name;
  EXPECT_THAT(shards.status().message(), HasSubstr("model.safetensors.index.json")) << name;
}

TEST(SafetensorsShardsTest, BadIndexesAreRefusedByName) {
  ExpectRefused("not_json", "{weight_map", "not JSON");
  ExpectRefused("no_map", R"({"metadata": {}})", "no \"weight_map\" object");
  ExpectRefused("empty_map", R"({"weight_map": {}})", "empty weight_map");
  ExpectRefused("non_string", R"({"weight_map": {"x": 3}})", "tensor 'x' maps to a non-string");
  ExpectRefused("parent_dir", R"({"weight_map": {"x": "../a.safetensors"}})",
                "'../a.safetensors', which is not a file name");
  ExpectRefused("absolute", R"({"weight_map": {"x": "/etc/passwd"}})", "not a file name");
  ExpectRefused("missing_shard", R"({"weight_map": {"x": "c.safetensors"}})",
                "shard c.safetensors (holding 'x') is not in");
  ExpectRefused("wrong_shard", R"({"weight_map": {"y": "a.safetensors"}})",
                "tensor 'y' is mapped to a.safetensors, which does not hold it");
}

TEST(SafetensorsShardsTest, ABrokenShardIsRefusedByItsOwnCheck) {
  const fs::path dir = MakeDir("broken_shard", kGoodIndex);
  std::ofstream(dir / "b.safetensors", std::ios::trunc) << "short";
  auto shards = SafetensorsShards::Open(dir.string());
  ASSERT_FALSE(shards.ok());
  EXPECT_THAT(shards.status().message(), HasSubstr("b.safetensors"));
}

}  // namespace
}  // namespace riskkv
