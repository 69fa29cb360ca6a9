// What the access file and token files share: a stamp that changes when a file is replaced or
// rewritten, and reading a file that holds credentials, never more than a bound.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace riskkv {

// mtime, size and inode as one string; "" when the file cannot be looked at.
std::string FileStamp(const std::string& path);

// The whole file: NotFound when it cannot be read, InvalidArgument when it holds more than
// `max_bytes` (refused without reading the rest).
absl::StatusOr<std::string> ReadBoundedFile(const std::string& path, int64_t max_bytes);

}  // namespace riskkv
