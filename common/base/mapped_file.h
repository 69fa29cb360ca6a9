// A whole file mapped read-only into memory, for formats that are parsed and used in place
// (GGUF and safetensors weights, predictor banks).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace riskkv {

// Owns one private read-only mapping; moving it moves the mapping (its address does not change),
// destroying it unmaps. The file is closed once mapped: the mapping stays valid when the file is
// renamed or removed afterwards.
class MappedFile {
 public:
  // Opens `path` read-only and maps all of it. Errors name the path and the system's reason:
  // NotFound when it does not exist, PermissionDenied when it may not be read, InvalidArgument
  // when it is not a regular file (a directory, a FIFO) or cannot be opened for another reason,
  // Internal when it cannot be mapped.
  static absl::StatusOr<MappedFile> Open(const std::string& path);

  // Maps nothing: size() 0. What a moved-from MappedFile is.
  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // The file's bytes, [data(), data() + size()). Never null: an empty file maps nothing (mmap
  // rejects length 0), and data() then points at a zero byte that parsers may read as a
  // bounds-checked header would.
  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  // The path given to Open.
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, void* map, uint64_t size);
  void Unmap();

  static const uint8_t kEmpty;
  std::string path_;
  void* map_ = nullptr;  // null when size_ is 0
  const uint8_t* data_ = &kEmpty;
  uint64_t size_ = 0;
};

// Lets the kernel drop the resident pages of [p, p + n), bytes of a MappedFile's mapping that
// the process keeps a copy of elsewhere (weights regrouped in panels): its resident set shrinks,
// and a later read brings the bytes back from the file. Only the whole pages inside the range
// go. A hint: nothing fails.
void DropMappedPages(const void* p, uint64_t n);

}  // namespace riskkv
