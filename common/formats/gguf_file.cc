// GGUF v2/v3 file: maps it read-only, checks the header and the section counts against the file
// size, then hands the sections to gguf_metadata.cc and gguf_tensors.cc.
#include "common/formats/gguf_file.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/formats/gguf_parser.h"

namespace riskkv {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian u32
// Smallest possible encodings, used to reject absurd counts before looping or reserving.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;  // key length, value type, 1-byte value
// Tensor info: name length, n_dims, ne[0], type, offset.
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;

}  // namespace

absl::Status GgufParser::Parse() {
  context_ = "header";
  ASSIGN_OR_RETURN(uint32_t magic, Read<uint32_t>("magic"));
  if (magic != kGgufMagic) {
    return Error(
        0, "magic",
        absl::StrCat("bad magic 0x", absl::Hex(magic, absl::kZeroPad8), ", not a GGUF file"));
  }
  ASSIGN_OR_RETURN(uint32_t version, Read<uint32_t>("version"));
  if (version == 1) {
    return Error(4, "version", "GGUF version 1 is not supported (only versions 2 and 3)");
  }
  if (version != 2 && version != 3) {
    const uint32_t swapped = __builtin_bswap32(version);
    return Error(
        4, "version",
        swapped == 2 || swapped == 3
            ? std::string("big-endian GGUF files are not supported")
            : absl::StrCat("unsupported GGUF version ", version, " (only versions 2 and 3)"));
  }
  f_.version_ = version;
  const uint64_t tensor_count_at = pos_;
  ASSIGN_OR_RETURN(uint64_t tensor_count, Read<uint64_t>("tensor count"));
  const uint64_t kv_count_at = pos_;
  ASSIGN_OR_RETURN(uint64_t kv_count, Read<uint64_t>("metadata count"));
  if (kv_count > remaining() / kMinKvBytes) {
    return Error(kv_count_at, "metadata count",
                 absl::StrCat(kv_count, " entries cannot fit in the ", remaining(), " bytes left"));
  }
  if (tensor_count > remaining() / kMinTensorInfoBytes) {
    return Error(
        tensor_count_at, "tensor count",
        absl::StrCat(tensor_count, " tensor infos cannot fit in the ", remaining(), " bytes left"));
  }
  // The counts are only bounded by the file size, so reserve modestly and let vectors grow:
  // a hostile count must not turn into a huge allocation before the entries are read.
  f_.metadata_.reserve(std::min<uint64_t>(kv_count, 1024));
  for (uint64_t i = 0; i < kv_count; ++i) RETURN_IF_ERROR(ReadMetadata(i));
  return ReadTensorDirectory(tensor_count);
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = path;
  // An empty file maps nothing; the parser then reports the missing magic.
  ASSIGN_OR_RETURN(file->mapping_, MappedFile::Open(path));
  GgufParser parser(*file);
  RETURN_IF_ERROR(parser.Parse());
  return file;
}

}  // namespace riskkv
