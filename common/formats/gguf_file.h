// Read-only, memory-mapped view of a GGUF v3 file: metadata key/values and tensor directory.
// Every offset and length in the file is validated before use; a malformed file yields a Status.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/mapped_file.h"
#include "common/model/tensor_view.h"

namespace riskkv {

// One metadata value. Arrays hold homogeneous elements; nested arrays are rejected at parse time.
struct GgufValue {
  enum class Type : uint32_t {
    kUint8 = 0,
    kInt8 = 1,
    kUint16 = 2,
    kInt16 = 3,
    kUint32 = 4,
    kInt32 = 5,
    kFloat32 = 6,
    kBool = 7,
    kString = 8,
    kArray = 9,
    kUint64 = 10,
    kInt64 = 11,
    kFloat64 = 12,
  };
  Type type = Type::kUint8;
  Type array_type = Type::kUint8;  // element type when type == kArray
  // Scalars: integers widen to int64/uint64, floats to double, bool to uint64 (0/1).
  std::variant<uint64_t, int64_t, double, std::string> scalar;
  // Arrays: exactly one of these is filled, chosen by the element type.
  std::vector<int64_t>
      ints;  // all integer and bool element types (uint64 above INT64_MAX rejected)
  std::vector<double> floats;        // float32 / float64 elements
  std::vector<std::string> strings;  // string elements
};

class GgufFile {
 public:
  // Maps the file and parses header, metadata and tensor directory. Errors name the file, the
  // byte offset and what was wrong (bad magic, unsupported version, truncated string, tensor data
  // past the end of the file, unsupported tensor type with its ggml id and name, ...).
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);

  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t file_size() const { return mapping_.size(); }

  // Metadata lookup. Typed getters fail with NotFound when the key is absent and
  // InvalidArgument when it has another type (integer getters accept any integer type whose
  // value fits).
  const GgufValue* Find(std::string_view key) const;
  bool Has(std::string_view key) const { return Find(key) != nullptr; }
  absl::StatusOr<uint64_t> GetUint(std::string_view key) const;
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;
  absl::StatusOr<double> GetFloat(std::string_view key) const;  // float32/float64
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  absl::StatusOr<std::string> GetString(std::string_view key) const;
  absl::StatusOr<std::vector<std::string>> GetStringArray(std::string_view key) const;
  absl::StatusOr<std::vector<double>> GetFloatArray(std::string_view key) const;
  absl::StatusOr<std::vector<int64_t>> GetIntArray(std::string_view key) const;
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }

  // Tensor directory in file order. TensorView::shape is outermost-first (PyTorch order), i.e.
  // the reverse of GGUF's ne[] order; data points into the mapping.
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* FindTensor(std::string_view name) const;

 private:
  GgufFile() = default;
  std::string path_;
  uint32_t version_ = 0;
  MappedFile mapping_;  // tensor data points into it
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<TensorView> tensors_;
  // Name -> index into metadata_ / tensors_; std::less<> allows lookup by string_view.
  std::map<std::string, size_t, std::less<>> metadata_index_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
  friend class GgufParser;
};

}  // namespace riskkv
