// A tiny GGUF builder for tests: writes valid files by default, and exposes every header field so
// tests can craft corrupt ones (bad magic, huge lengths, misaligned offsets, unknown types, ...).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "common/formats/gguf_file.h"

namespace riskkv::testing {

// ggml tensor type ids as they appear in the file.
inline constexpr uint32_t kGgmlF32 = 0;
inline constexpr uint32_t kGgmlF16 = 1;
inline constexpr uint32_t kGgmlQ4_0 = 2;
inline constexpr uint32_t kGgmlQ4_1 = 3;
inline constexpr uint32_t kGgmlQ5_0 = 6;
inline constexpr uint32_t kGgmlQ5_1 = 7;
inline constexpr uint32_t kGgmlQ8_0 = 8;
inline constexpr uint32_t kGgmlQ2_K = 10;
inline constexpr uint32_t kGgmlQ4_K = 12;
inline constexpr uint32_t kGgmlQ5_K = 13;
inline constexpr uint32_t kGgmlQ6_K = 14;
inline constexpr uint32_t kGgmlBF16 = 30;

using Bytes = std::vector<uint8_t>;

// Little-endian encoders (the test host is little-endian, as is GGUF).
template <typename T>
void Put(Bytes& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}
inline void PutString(Bytes& out, const std::string& s) {
  Put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

class GgufTestWriter {
 public:
  using Type = GgufValue::Type;

  // Appends a metadata entry whose value bytes are given verbatim (for corrupt values).
  void AddRaw(const std::string& key, uint32_t type, const Bytes& value) {
    PutString(kv_, key);
    Put<uint32_t>(kv_, type);
    kv_.insert(kv_.end(), value.begin(), value.end());
    ++kv_count_;
  }
  template <typename T>
  void AddScalar(const std::string& key, Type type, T v) {
    Bytes b;
    Put<T>(b, v);
    AddRaw(key, static_cast<uint32_t>(type), b);
  }
  void AddString(const std::string& key, const std::string& v) {
    Bytes b;
    PutString(b, v);
    AddRaw(key, static_cast<uint32_t>(Type::kString), b);
  }
  template <typename T>
  void AddArray(const std::string& key, Type elem, const std::vector<T>& v) {
    Bytes b;
    Put<uint32_t>(b, static_cast<uint32_t>(elem));
    Put<uint64_t>(b, v.size());
    for (const T& x : v) Put<T>(b, x);
    AddRaw(key, static_cast<uint32_t>(Type::kArray), b);
  }
  void AddStringArray(const std::string& key, const std::vector<std::string>& v) {
    Bytes b;
    Put<uint32_t>(b, static_cast<uint32_t>(Type::kString));
    Put<uint64_t>(b, v.size());
    for (const std::string& s : v) PutString(b, s);
    AddRaw(key, static_cast<uint32_t>(Type::kArray), b);
  }
  // Sets the data layout alignment and records it as general.alignment (uint32).
  void SetAlignment(uint32_t a) {
    alignment = a;
    AddScalar<uint32_t>("general.alignment", Type::kUint32, a);
  }

  // A tensor with `ne` in GGUF order (innermost first). Its data is placed at the next aligned
  // offset unless `offset` is given, in which case only the directory entry points there.
  void AddTensor(const std::string& name, uint32_t ggml_type, const std::vector<uint64_t>& ne,
                 const Bytes& data, std::optional<uint64_t> offset = std::nullopt) {
    tensors_.push_back({name, ggml_type, ne, data, offset});
  }

  Bytes Build() const {
    Bytes out;
    Put<uint32_t>(out, magic);
    Put<uint32_t>(out, version);
    Put<uint64_t>(out, tensor_count.value_or(tensors_.size()));
    Put<uint64_t>(out, kv_count.value_or(kv_count_));
    out.insert(out.end(), kv_.begin(), kv_.end());
    // Lay the data out first so the directory can point at it.
    Bytes data;
    std::vector<uint64_t> offsets;
    for (const Tensor& t : tensors_) {
      if (t.offset) {
        offsets.push_back(*t.offset);
        continue;
      }
      data.resize(AlignUp(data.size()));
      offsets.push_back(data.size());
      data.insert(data.end(), t.data.begin(), t.data.end());
    }
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const Tensor& t = tensors_[i];
      PutString(out, t.name);
      Put<uint32_t>(out, t.ne.size());
      for (uint64_t d : t.ne) Put<uint64_t>(out, d);
      Put<uint32_t>(out, t.type);
      Put<uint64_t>(out, offsets[i]);
    }
    // No padding after the last tensor: then cutting any byte off the file must be an error.
    if (!data.empty()) out.resize(AlignUp(out.size()));
    out.insert(out.end(), data.begin(), data.end());
    return out;
  }

  // Header fields; the counts default to what was added.
  uint32_t magic = 0x46554747;
  uint32_t version = 3;
  std::optional<uint64_t> tensor_count;
  std::optional<uint64_t> kv_count;
  uint64_t alignment = 32;  // layout only; SetAlignment also writes the key

 private:
  struct Tensor {
    std::string name;
    uint32_t type;
    std::vector<uint64_t> ne;
    Bytes data;
    std::optional<uint64_t> offset;
  };
  size_t AlignUp(size_t n) const { return (n + alignment - 1) / alignment * alignment; }

  Bytes kv_;
  uint64_t kv_count_ = 0;
  std::vector<Tensor> tensors_;
};

// A directory private to this test process (ctest runs test binaries in parallel, and release and
// sanitizer builds may run at once), removed when the test program ends.
inline const std::filesystem::path& ProcessTempDir() {
  static const std::filesystem::path dir = [] {
    std::filesystem::path d = std::filesystem::path(::testing::TempDir()) /
                              ("riskkv_files_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}
class RemoveProcessTempDir : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(ProcessTempDir(), ec);
  }
};
inline ::testing::Environment* const kRemoveProcessTempDir =
    ::testing::AddGlobalTestEnvironment(new RemoveProcessTempDir);

// Writes `bytes` to a fresh file in ProcessTempDir() and returns its path.
inline std::string WriteTempFile(const std::string& name, const Bytes& bytes) {
  const std::filesystem::path path = ProcessTempDir() / name;
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  f.close();
  EXPECT_TRUE(f.good()) << "cannot write " << path;
  return path.string();
}

// `n` bytes of a recognisable pattern, different per seed.
inline Bytes Pattern(size_t n, uint8_t seed) {
  Bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(seed * 31 + i * 7);
  return b;
}

}  // namespace riskkv::testing
