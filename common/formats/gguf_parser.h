// Internal to the GGUF reader: the bounds-checked sequential reader that GgufFile::Open runs over
// the mapping. Its sections live in gguf_file.cc (header), gguf_metadata.cc and gguf_tensors.cc.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/formats/gguf_file.h"

namespace riskkv {

// Multi-byte fields are copied straight out of the mapping.
static_assert(std::endian::native == std::endian::little,
              "GGUF parsing assumes a little-endian host");

// Sequential reader over the mapping. Every read checks the bytes remaining first; errors name
// the file, the current context (which entry is being parsed), what was read and its offset.
class GgufParser {
 public:
  explicit GgufParser(GgufFile& file)
      : f_(file), base_(file.mapping_.data()), size_(file.mapping_.size()) {}

  absl::Status Parse();

 private:
  using Type = GgufValue::Type;
  static constexpr uint64_t kDefaultAlignment = 32;

  uint64_t remaining() const { return size_ - pos_; }

  absl::Status Error(uint64_t at, absl::string_view what, absl::string_view problem) const {
    return absl::InvalidArgumentError(absl::StrCat(f_.path_, ": ", context_,
                                                   context_.empty() ? "" : ": ", what,
                                                   " at byte offset ", at, ": ", problem));
  }

  absl::Status Need(uint64_t n, absl::string_view what) const {
    if (n <= remaining()) return absl::OkStatus();
    return Error(pos_, what,
                 absl::StrCat("needs ", n, " bytes but the file ends after ", remaining(),
                              " (file size ", size_, ")"));
  }

  template <typename T>
  absl::StatusOr<T> Read(absl::string_view what) {
    RETURN_IF_ERROR(Need(sizeof(T), what));
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  absl::StatusOr<std::string> ReadString(absl::string_view what) {
    const uint64_t at = pos_;
    ASSIGN_OR_RETURN(uint64_t len, Read<uint64_t>(what));
    if (len > remaining()) {
      return Error(at, what,
                   absl::StrCat("string length ", len, " exceeds the ", remaining(),
                                " bytes left in the file (file size ", size_, ")"));
    }
    std::string s(AsChars(base_ + pos_, len));
    pos_ += len;
    return s;
  }

  absl::StatusOr<Type> ReadType(absl::string_view what) {
    const uint64_t at = pos_;
    ASSIGN_OR_RETURN(uint32_t raw, Read<uint32_t>(what));
    if (raw > static_cast<uint32_t>(Type::kFloat64)) {
      return Error(at, what, absl::StrCat("unknown metadata value type ", raw));
    }
    return static_cast<Type>(raw);
  }

  template <typename T>
  absl::StatusOr<int64_t> Widen(absl::string_view what) {
    ASSIGN_OR_RETURN(T v, Read<T>(what));
    return static_cast<int64_t>(v);
  }

  // Metadata key/values (gguf_metadata.cc).
  absl::StatusOr<GgufValue> ReadValue(Type type);
  absl::Status ReadArray(GgufValue& value);
  // Reads one integer or bool of `type` (not float/string/array) as int64, or reports overflow.
  absl::StatusOr<int64_t> ReadIntElement(Type type);
  // Also takes general.alignment into alignment_, which the tensor directory depends on.
  absl::Status ReadMetadata(uint64_t index);

  // Tensor directory (gguf_tensors.cc). Reads `count` tensor infos, then points each tensor at
  // its bytes in the data section that follows the directory.
  absl::Status ReadTensorDirectory(uint64_t count);
  absl::Status ReadTensorInfo(uint64_t index, std::vector<uint64_t>& rel_offsets,
                              std::vector<uint64_t>& info_offsets);

  GgufFile& f_;
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
  uint64_t alignment_ = kDefaultAlignment;
  std::string context_;
};

}  // namespace riskkv
